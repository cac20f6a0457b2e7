import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseUpstreams
import Logging
import NIOHTTP1

/// A relayed request the event loop can answer on its own: everything about it is known
/// without waiting (a plain-http backend, no request body, a cached identity that passes
/// the route's rule). Everything else goes the general way, through Hummingbird.
struct FastRelayPlan {
    let route: RouteSettings
    let backend: BackendAddress
    let head: HTTPRequestHead
    let requestID: String
    let isHead: Bool
    /// The app's path, for logs and the `instance` of problems.
    let path: String
}

/// Where a route's backend listens, parsed once from its URL.
struct BackendAddress: Hashable, Sendable {
    let host: String
    let port: Int
    /// The path prefix the rest of the app's path is appended to (no trailing slash).
    let basePath: String
    var key: String { "\(host):\(port)" }

    /// `nil` for https backends (they take the general path, which speaks TLS).
    init?(url: String) {
        guard url.hasPrefix("http://") else { return nil }
        let rest = url.dropFirst(7)
        let authority = rest.prefix { $0 != "/" }
        let path = rest.dropFirst(authority.count)
        var host = String(authority)
        var port = 80
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let parsed = Int(authority[authority.index(after: colon)...]) else { return nil }
            host = String(authority[..<colon])
            port = parsed
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host
        self.port = port
        self.basePath = path.hasSuffix("/") ? String(path.dropLast()) : String(path)
    }
}

/// Decides, synchronously and on the event loop, whether a request takes the fast path.
struct FastRelayPlanner: Sendable {
    let configuration: GatehouseConfiguration
    let relay: RelayServices
    let sessions: SessionServices?
    let backends: [String: BackendAddress]
    /// Each route's header policy, built once.
    let policies: [String: RelayHeaderPolicy]
    let logger: Logger

    init(configuration: GatehouseConfiguration, relay: RelayServices, sessions: SessionServices?, logger: Logger) {
        self.configuration = configuration
        self.relay = relay
        self.sessions = sessions
        self.logger = logger
        var backends: [String: BackendAddress] = [:]
        for route in configuration.routes {
            if let address = BackendAddress(url: route.backend) { backends[route.prefix] = address }
        }
        self.backends = backends
        self.policies = Dictionary(configuration.routes.map {
            ($0.prefix, RelayHeaderPolicy(route: $0, allIdentityHeaders: relay.identityHeaderNames))
        }, uniquingKeysWith: { first, _ in first })
    }

    private static let authorization = Array("authorization".utf8)

    func plan(_ request: HTTPRequestHead, remoteAddress: String?) -> FastRelayPlan? {
        guard request.method == .GET || request.method == .HEAD, request.version == .http1_1 else { return nil }
        let target = request.uri
        let pathEnd = target.firstIndex(of: "?") ?? target.endIndex
        let path = String(target[..<pathEnd])
        guard let route = configuration.route(for: path), let backend = backends[route.prefix], let policy = policies[route.prefix],
              route.methods.contains(request.method.rawValue), route.authorization != .assertion,
              RelayHeaderPolicy.isSafe(path: path) else { return nil }
        let fields = request.headers
        // A body, an expectation or a wish to close: the general path handles those.
        if fields.contains(name: "transfer-encoding") || fields.contains(name: "expect") { return nil }
        if let length = fields.first(name: "content-length"), length != "0" { return nil }
        let connectionValues = fields["connection"]
        let connectionTokens = connectionValues.isEmpty ? [] : RelayHeaderPolicy.connectionTokens(connectionValues)
        if connectionTokens.contains("close") || connectionTokens.contains("upgrade") { return nil }
        guard var token = Gatehouse.bearerToken(fields["authorization"]) else { return nil }
        var sealed = false
        if token.hasPrefix(SessionServices.accessPrefix) {
            // Only a session opened moments ago by the general path, and not due for refresh.
            let now = Date()
            guard let sessions, let view = sessions.views.get(SecureToken.hash(token), now: now), view.upstream == route.upstream,
                  !sessions.needsRefresh(view, now: now) else { return nil }
            token = view.tokens.accessToken.reveal()
            sealed = true
        }
        guard case .active(let identity) = relay.cache.peek(token: token, upstream: route.upstream),
              route.rule.violation(by: identity) == nil else { return nil }

        let requestID = fields.first(name: "x-request-id").flatMap(RequestLogMiddleware.acceptable) ?? RequestIDGenerator.shared.next()
        var headers = HTTPHeaders()
        headers.reserveCapacity(fields.count + 8)
        headers.add(name: "Host", value: backend.port == 80 ? backend.host : "\(backend.host):\(backend.port)")
        for (name, value) in fields where policy.forwardsRequestHeader(name, connectionTokens: connectionTokens) {
            if sealed, RelayHeaderPolicy.equalsIgnoringASCIICase(name, Self.authorization) { continue }
            headers.add(name: name, value: value)
        }
        if sealed, route.authorization == .passthrough {
            headers.add(name: "Authorization", value: "Bearer " + token)
        }
        for header in route.identityHeaders {
            if let value = identity.value(of: header.source) { headers.add(name: header.name, value: Gatehouse.headerSafe(value)) }
        }
        relay.addForwardingHeaders(to: &headers, remoteAddress: remoteAddress, requestID: requestID)
        let rest = path.dropFirst(route.prefix.hasSuffix("/") ? route.prefix.count - 1 : route.prefix.count)
        let uri = backend.basePath + rest + target[pathEnd...]
        let head = HTTPRequestHead(version: .http1_1, method: request.method, uri: uri, headers: headers)
        return FastRelayPlan(route: route, backend: backend, head: head, requestID: requestID, isHead: request.method == .HEAD, path: path)
    }
}
