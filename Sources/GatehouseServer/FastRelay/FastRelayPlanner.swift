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
    let backend: RouteBackend
    let head: HTTPRequestHead
    let requestID: String
    /// The app's own plain `X-Request-Id`, for the log line.
    let clientRequestID: String?
    let isHead: Bool
    /// The app's path, for logs and the `instance` of problems.
    let path: String
}

/// Decides, synchronously and on the event loop, whether a request takes the fast path. The
/// decision itself is `RelayAdmission`, shared with the general path; this adds only what the
/// fast path can carry out (GET or HEAD without a body over HTTP/1.1, a plain-http backend, no
/// assertion to sign, a cached identity, a subject within `relay_per_subject`). A refused
/// request goes the general way, which answers it with the same refusal (or the 429).
///
/// While tracing is on the planner declines everything: only the general path has spans.
struct FastRelayPlanner: Sendable {
    let configuration: GatehouseConfiguration
    let relay: RelayServices
    let sessions: SessionServices?
    let limits: RateLimiters?
    let tracingEnabled: Bool
    let logger: Logger

    init(configuration: GatehouseConfiguration, relay: RelayServices, sessions: SessionServices?, limits: RateLimiters? = nil,
         tracingEnabled: Bool = false, logger: Logger) {
        self.configuration = configuration
        self.relay = relay
        self.sessions = sessions
        self.limits = limits
        self.tracingEnabled = tracingEnabled
        self.logger = logger
    }

    func plan(_ request: HTTPRequestHead, remoteAddress: String?) -> FastRelayPlan? {
        guard !tracingEnabled, request.method == .GET || request.method == .HEAD, request.version == .http1_1 else { return nil }
        let target = request.uri
        let pathEnd = target.firstIndex(of: "?") ?? target.endIndex
        let path = String(target[..<pathEnd])
        guard let route = configuration.route(for: path), route.authorization != .assertion,
              let backend = relay.backends[route.prefix], !backend.isTLS, let policy = relay.policies[route.prefix] else { return nil }
        let head = NIORelayHead(head: request)
        guard case .success(let admission) = RelayAdmission.admit(head, route: route, backendPath: backend.basePath),
              admission.body == .none, head.values(of: .expect).isEmpty,
              !admission.connectionTokens.contains("close"), !admission.connectionTokens.contains("upgrade") else { return nil }
        var token = admission.bearer
        var sealed = false
        if token.hasPrefix(SessionServices.accessPrefix) {
            // Only a session opened moments ago by the general path, and not due for refresh.
            let now = Date()
            guard let sessions, let view = sessions.views.get(SecureToken.hash(token), now: now), view.upstream == route.upstream,
                  !sessions.needsRefresh(view, now: now) else { return nil }
            token = view.tokens.accessToken.reveal()
            sealed = true
        } else if token.hasPrefix(SessionServices.refreshPrefix) {
            return nil
        } else if configuration.upstreams[route.upstream]?.identity?.kind == .session {
            // Such a route knows its callers only through their sealed session.
            return nil
        }
        guard case .active(let identity) = relay.cache.peek(token: token, upstream: route.upstream),
              admission.authorize(identity) == nil else { return nil }
        // Last: a token is taken only for a request the fast path will carry. Over the limit, the
        // general path takes again, is refused too, and answers (and counts) the 429.
        if let limiter = limits?.relayPerSubject, limiter.take(Gatehouse.relaySubjectKey(identity, token: token)) != nil { return nil }

        let requestID = RequestIDGenerator.shared.next()
        let clientRequestID = head.requestID.flatMap(RelayForwarding.acceptableClientRequestID)
        let host = backend.host.contains(":") ? "[\(backend.host)]" : backend.host
        let headers = policy.outboundHeaders(
            from: head, connectionTokens: admission.connectionTokens, identity: identity,
            authorization: sealed && route.authorization == .passthrough ? token : nil,
            host: backend.port == 80 ? host : "\(host):\(backend.port)", forwarding: relay.forwarding,
            remoteAddress: remoteAddress, requestID: requestID, clientRequestID: clientRequestID)
        let outbound = HTTPRequestHead(version: .http1_1, method: request.method, uri: admission.target, headers: headers)
        return FastRelayPlan(route: route, backend: backend, head: outbound, requestID: requestID, clientRequestID: clientRequestID,
                             isHead: request.method == .HEAD, path: path)
    }
}

/// NIO's request head as the relay's admission reads it: the fields admission asks for are
/// picked out in one pass over the head (a lookup by name would scan it once per field).
struct NIORelayHead: RelayRequestHead {
    let head: HTTPRequestHead
    private(set) var authorization: [String] = []
    private(set) var contentLength: [String] = []
    private(set) var transferEncoding: [String] = []
    private(set) var expect: [String] = []
    private(set) var connection: [String] = []
    /// The first `X-Request-Id`, for the log line's `client_request_id`.
    private(set) var requestID: String?

    init(head: HTTPRequestHead) {
        self.head = head
        for (name, value) in head.headers {
            switch name.utf8.count {
            case 6 where RelayHeaderPolicy.isNamed(name, "expect"): expect.append(value)
            case 10 where RelayHeaderPolicy.isNamed(name, "connection"): connection.append(value)
            case 12 where requestID == nil && RelayHeaderPolicy.isNamed(name, "x-request-id"): requestID = value
            case 13 where RelayHeaderPolicy.isNamed(name, "authorization"): authorization.append(value)
            case 14 where RelayHeaderPolicy.isNamed(name, "content-length"): contentLength.append(value)
            case 17 where RelayHeaderPolicy.isNamed(name, "transfer-encoding"): transferEncoding.append(value)
            default: break
            }
        }
    }

    var methodName: String { head.method.rawValue }
    var rawTarget: String { head.uri }

    func values(of field: RelayHeadField) -> [String] {
        switch field {
        case .authorization: authorization
        case .contentLength: contentLength
        case .transferEncoding: transferEncoding
        case .expect: expect
        case .connection: connection
        }
    }

    func forEachField(_ body: (String, String) -> Void) {
        for (name, value) in head.headers { body(name, value) }
    }
}
