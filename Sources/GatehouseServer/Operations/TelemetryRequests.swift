import Metrics
import GatehouseCore
import HTTPTypes
import Tracing

/// The `route` label of requests (metrics, span names): the endpoint's path for Gatehouse's own
/// endpoints, a relayed route's prefix followed by `/*`, `unmatched` for anything else. Never
/// a raw path: a label's values stay few whatever clients send.
enum RouteLabel {
    static let unmatched = "unmatched"

    /// The label of `path`, given the paths Gatehouse answers and the relayed routes.
    static func of(path: String, endpoints: [String: [HTTPRequest.Method]], relayed route: RouteSettings?) -> String {
        if let route { return of(route) }
        if ForwardAuthFace.owns(path) { return ForwardAuthSettings.path }
        let routed = routerPath(path)
        return endpoints[routed] != nil ? routed : unmatched
    }

    /// `path` as Hummingbird's router matches it: empty segments and a trailing `/` dropped
    /// (`//oauth//token/` reaches `/oauth/token`). Whatever decides by path before the router
    /// (rate limits, labels) must see this form, or a doubled slash slips past it.
    static func routerPath(_ path: String) -> String {
        guard path.contains("//") || (path.count > 1 && path.hasSuffix("/")) else { return path }
        return "/" + path.split(separator: "/").joined(separator: "/")
    }

    /// The label of a relayed route: `/api` → `/api/*`.
    static func of(_ route: RouteSettings) -> String {
        route.prefix.hasSuffix("/") ? route.prefix + "*" : route.prefix + "/*"
    }
}

/// The `status_class` label: `1xx` … `5xx`.
enum StatusClass {
    static let labels = ["1xx", "2xx", "3xx", "4xx", "5xx"]

    /// The index in `labels` of `status` (out-of-range codes count with the nearest class).
    static func index(of status: Int) -> Int {
        min(max(status / 100, 1), 5) - 1
    }

    static func label(of status: Int) -> String {
        labels[index(of: status)]
    }
}

/// The `method` label: the methods of RFC 9110 and PATCH by name, anything else `other`
/// (a client choosing method tokens must not add series).
enum MethodLabel {
    /// Every value of the label: the known methods, then `other`.
    static let all = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "other"]

    /// The position of `method`'s label in `all` (a few comparisons of short strings, no hashing).
    static func index(of method: String) -> Int {
        all.firstIndex(of: method) ?? all.count - 1
    }

    static func of(_ method: String) -> String {
        all[index(of: method)]
    }
}

/// The handles of `gatehouse_http_requests_total`, `gatehouse_http_request_duration_seconds`
/// and `gatehouse_relay_requests_total`, made once per label set and kept for the process.
enum RequestMetrics {
    struct CounterKey: Hashable, Sendable {
        let route: String
        let method: String
        let statusClass: String
    }

    private static let counters = HandleCache<CounterKey, Counter>()
    private static let timers = HandleCache<String, Timer>()
    private static let relayCounters = HandleCache<String, Counter>()
    private static let routeBundles = HandleCache<String, RelayRouteMetrics>()

    static func requests(route: String, method: String, status: Int) -> Counter {
        counters.handle(for: CounterKey(route: route, method: MethodLabel.of(method), statusClass: StatusClass.label(of: status))) {
            Counter(label: GatehouseMetrics.requestsTotal,
                    dimensions: [("route", $0.route), ("method", $0.method), ("status_class", $0.statusClass)])
        }
    }

    static func duration(route: String) -> Timer {
        timers.handle(for: route) { Timer(label: GatehouseMetrics.requestDuration, dimensions: [("route", $0)]) }
    }

    /// `gatehouse_relay_requests_total{route, path="general"}`.
    static func generalRelay(route: String) -> Counter {
        relayCounters.handle(for: route) {
            Counter(label: GatehouseMetrics.relayRequestsTotal, dimensions: [("route", $0), ("path", "general")])
        }
    }

    /// Everything the fast path counts for `route`, made once per route label and set of methods.
    static func fastRelay(_ route: RouteSettings) -> RelayRouteMetrics {
        let label = RouteLabel.of(route)
        return routeBundles.handle(for: label + " " + route.methods.sorted().joined(separator: ",")) { _ in
            RelayRouteMetrics(route: label, methods: route.methods)
        }
    }

    /// Records one finished request of the general path.
    static func record(route: String, method: String, status: Int, relayed: Bool, elapsed: Duration) {
        requests(route: route, method: method, status: status).increment()
        duration(route: route).record(duration: elapsed)
        if relayed { generalRelay(route: route).increment() }
    }
}

/// The fast path's handles for one route, made once: a finished exchange costs an atomic
/// increment per counter and a histogram record, with no lookup, lock of ours or allocation.
final class RelayRouteMetrics: Sendable {
    let route: String
    /// `gatehouse_http_requests_total{route, method, status_class}` of the route's methods, by
    /// `MethodLabel.index` then status class (`nil` for a method the route does not take).
    private let requests: [[Counter]?]
    private let duration: Timer
    private let relayed: Counter

    /// `methods`: the route's (`routes[].methods`); `factory`: where the handles come from,
    /// `nil`: the process's `MetricsSystem`.
    init(route: String, methods: Set<String>, factory: (any MetricsFactory)? = nil) {
        self.route = route
        func counter(_ label: String, _ dimensions: [(String, String)]) -> Counter {
            factory.map { Counter(label: label, dimensions: dimensions, factory: $0) } ?? Counter(label: label, dimensions: dimensions)
        }
        requests = MethodLabel.all.map { method in
            guard methods.contains(method) else { return nil }
            return StatusClass.labels.map { counter(GatehouseMetrics.requestsTotal, [("route", route), ("method", method), ("status_class", $0)]) }
        }
        relayed = counter(GatehouseMetrics.relayRequestsTotal, [("route", route), ("path", "fast")])
        let durationDimensions = [("route", route)]
        duration = factory.map { Timer(label: GatehouseMetrics.requestDuration, dimensions: durationDimensions, factory: $0) }
            ?? Timer(label: GatehouseMetrics.requestDuration, dimensions: durationDimensions)
    }

    /// One fast exchange of `method`, answered `status` after `nanoseconds`.
    func record(method: String, status: Int, nanoseconds: Int64) {
        if let byStatus = requests[MethodLabel.index(of: method)] {
            byStatus[StatusClass.index(of: status)].increment()
        } else {  // not one of the route's methods (admission refuses those): counted all the same
            RequestMetrics.requests(route: route, method: method, status: status).increment()
        }
        duration.recordNanoseconds(nanoseconds)
        relayed.increment()
    }
}

/// Reads W3C `traceparent`/`tracestate` (or whatever the bootstrapped instrument asks for)
/// from a request's fields.
struct HTTPFieldsExtractor: Extractor {
    func extract(key: String, from fields: HTTPFields) -> String? {
        HTTPField.Name(key).flatMap { fields[$0] }
    }
}
