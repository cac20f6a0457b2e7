import GatehouseCore
import Instrumentation
import OTel
import ServiceLifecycle

/// OpenTelemetry traces (swift-otel, OTLP/HTTP protobuf), off unless `observability.tracing`
/// is set. The standard `OTEL_*` environment variables still apply on top (batch delay, headers).
enum TracingExport {
    /// Bootstraps the process's tracer (once per process) and returns the exporter's service.
    static func bootstrap(_ settings: TracingSettings) throws -> any Service {
        var configuration = OTel.Configuration.default
        configuration.serviceName = settings.serviceName
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        configuration.traces.enabled = true
        configuration.traces.exporter = .otlp
        configuration.traces.otlpExporter.endpoint = settings.endpoint
        configuration.traces.otlpExporter.protocol = .httpProtobuf
        configuration.traces.sampler = .parentBasedTraceIDRatio(ratio: settings.sampleRatio) ?? .parentBasedAlwaysOn
        configuration.propagators = [.traceContext]
        let (tracer, service) = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(tracer)
        return service
    }
}
