public import AsyncHTTPClient
public import CoreMetrics
import Metrics
public import GatehouseCore
import Tracing

/// Counts, times and traces Gatehouse's calls to one upstream: `gatehouse_upstream_requests_total
/// {upstream,endpoint,outcome}`, `gatehouse_upstream_request_duration_seconds{upstream,endpoint}`,
/// and one client span per call with the W3C `traceparent` injected into the request.
///
/// The span carries `gatehouse.upstream`, `gatehouse.endpoint`, `gatehouse.outcome` and
/// `http.response.status_code`: never the URL (a query may hold a token), never a header or a body.
/// With tracing off, the span and the injection are swift-distributed-tracing's no-ops.
public struct UpstreamTelemetry: Sendable {
    public let upstream: String
    let metrics: UpstreamMetrics

    /// - Parameter metrics: `nil` (production) counts through `GatehouseMetrics`, in the process's
    ///   `MetricsSystem`; a test hands in its own factory.
    public init(upstream: String, metrics: (any MetricsFactory)? = nil) {
        self.upstream = upstream
        self.metrics = UpstreamMetrics(factory: metrics)
    }

    /// One call: `send` gets `request` with the trace context added and returns the answer, whose
    /// outcome and status `classify` reads. A thrown error is counted as `timeout` or `unreachable`
    /// and rethrown as it was.
    public func call<Answer>(_ endpoint: UpstreamEndpoint, spanName: String? = nil, _ request: HTTPClientRequest,
                             classify: (Answer) -> (outcome: GatehouseMetrics.Outcome, status: Int),
                             send: (HTTPClientRequest) async throws -> Answer) async throws -> Answer {
        let start = ContinuousClock.now
        return try await withSpan(spanName ?? endpoint.spanName, ofKind: .client) { span in
            var request = request
            InstrumentationSystem.instrument.inject(ServiceContext.current ?? .topLevel, into: &request.headers, using: HTTPHeadersInjector())
            do {
                let answer = try await send(request)
                let (outcome, status) = classify(answer)
                finish(endpoint, outcome, status: status, since: start, span: span)
                return answer
            } catch {
                finish(endpoint, GatehouseMetrics.Outcome(transportError: error), status: nil, since: start, span: span)
                throw error
            }
        }
    }

    /// A call Gatehouse refused to make because of a limit (`gatehouse_rate_limited_total{limit}`).
    public func rateLimited(_ limit: GatehouseMetrics.Limit) {
        metrics.rateLimited(limit)
    }

    private func finish(_ endpoint: UpstreamEndpoint, _ outcome: GatehouseMetrics.Outcome, status: Int?,
                        since start: ContinuousClock.Instant, span: any Span) {
        metrics.call(upstream: upstream, endpoint: endpoint, outcome: outcome, duration: .now - start)
        guard span.isRecording else { return }
        span.attributes["gatehouse.upstream"] = upstream
        span.attributes["gatehouse.endpoint"] = endpoint.rawValue
        span.attributes["gatehouse.outcome"] = outcome.rawValue
        if let status { span.attributes["http.response.status_code"] = status }
        if outcome.isFailure { span.setStatus(SpanStatus(code: .error)) }
    }
}

/// Where upstream calls are counted, under `GatehouseMetrics`' names: the process's
/// `MetricsSystem` (read when the upstream's client is made, after `serve` bootstrapped it), or
/// a factory a test hands in. Handles are made once per label set.
final class UpstreamMetrics: Sendable {
    private let factory: any MetricsFactory
    private let counters = HandleCache<Key, Counter>()
    private let timers = HandleCache<Key, Timer>()
    private let limits = HandleCache<String, Counter>()

    private struct Key: Hashable, Sendable {
        let upstream: String
        let endpoint: String
        let outcome: String
    }

    init(factory: (any MetricsFactory)?) {
        self.factory = factory ?? MetricsSystem.factory
    }

    func call(upstream: String, endpoint: UpstreamEndpoint, outcome: GatehouseMetrics.Outcome, duration: Duration) {
        counters.handle(for: Key(upstream: upstream, endpoint: endpoint.rawValue, outcome: outcome.rawValue)) {
            Counter(label: GatehouseMetrics.upstreamRequestsTotal,
                    dimensions: [("upstream", $0.upstream), ("endpoint", $0.endpoint), ("outcome", $0.outcome)], factory: factory)
        }.increment()
        timers.handle(for: Key(upstream: upstream, endpoint: endpoint.rawValue, outcome: "")) {
            Timer(label: GatehouseMetrics.upstreamRequestDuration, dimensions: [("upstream", $0.upstream), ("endpoint", $0.endpoint)],
                  factory: factory)
        }.record(duration: duration)
    }

    func rateLimited(_ limit: GatehouseMetrics.Limit) {
        limits.handle(for: limit.rawValue) {
            Counter(label: GatehouseMetrics.rateLimitedTotal, dimensions: [("limit", $0)], factory: factory)
        }.increment()
    }
}
