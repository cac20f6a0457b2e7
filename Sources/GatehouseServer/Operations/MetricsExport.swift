import CoreMetrics
import Foundation
import GatehouseCore
import Hummingbird
import HTTPTypes
public import Logging
import Metrics
import NIOCore
public import Prometheus
import ServiceLifecycle

/// `/metrics` in Prometheus's text format (swift-prometheus over swift-metrics): bootstrapped
/// once per process by `serve` when `observability.metrics` is set, served on a listener of
/// its own (`listen`) and/or on the public port to the `allow`ed addresses.
public enum MetricsExport {
    /// Makes the process's registry and points swift-metrics at it (once per process).
    public static func bootstrap() -> PrometheusCollectorRegistry {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(DescribedMetricsFactory(registry: registry))
        return registry
    }

    /// The exposition (text format 0.0.4), never cached.
    static func response(_ registry: PrometheusCollectorRegistry) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/plain; version=0.0.4; charset=utf-8"
        headers[.cacheControl] = "no-store"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
    }

    /// The separate listener: `GET /metrics` and nothing else.
    static func listener(host: String, port: Int, registry: PrometheusCollectorRegistry, logger: Logger) -> some Service {
        let router = Router()
        router.get("/metrics") { _, _ in response(registry) }
        return Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: nil),
            onServerRunning: { channel in
                logger.notice("metrics listener is ready", metadata: ["address": .string(channel.localAddress?.description ?? "?")])
            },
            logger: logger)
    }
}

/// swift-prometheus's factory, with each metric's `# HELP` line (`GatehouseMetrics.help`; the
/// plain factory writes none, and `promtool check metrics` wants one) and Gatehouse's buckets.
struct DescribedMetricsFactory: MetricsFactory {
    let registry: PrometheusCollectorRegistry
    private let base: PrometheusMetricsFactory

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        var base = PrometheusMetricsFactory(registry: registry)
        base.defaultDurationHistogramBuckets = GatehouseMetrics.durationBuckets
        self.base = base
    }

    private func descriptor(_ label: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: label, unitName: "", helpText: GatehouseMetrics.help[label] ?? label.replacingOccurrences(of: "_", with: " "))
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        registry.makeCounter(descriptor: descriptor(label), labels: dimensions)
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        guard aggregate else { return registry.makeGauge(descriptor: descriptor(label), labels: dimensions) }
        return registry.makeValueHistogram(descriptor: descriptor(label), labels: dimensions,
                                           buckets: GatehouseMetrics.durationBuckets.map { Double($0.components.seconds) + Double($0.components.attoseconds) / 1e18 })
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        registry.makeGauge(descriptor: descriptor(label), labels: dimensions)
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        registry.makeDurationHistogram(descriptor: descriptor(label), labels: dimensions, buckets: GatehouseMetrics.durationBuckets)
    }

    func destroyCounter(_ handler: any CounterHandler) { base.destroyCounter(handler) }
    func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) { base.destroyFloatingPointCounter(handler) }
    func destroyRecorder(_ handler: any RecorderHandler) { base.destroyRecorder(handler) }
    func destroyMeter(_ handler: any MeterHandler) { base.destroyMeter(handler) }
    func destroyTimer(_ handler: any TimerHandler) { base.destroyTimer(handler) }
}
