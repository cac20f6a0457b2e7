import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseUpstreams
import Logging
import NIOCore
import NIOHTTP1

/// What the fast path knows of one route, worked out once per configuration: the planner and
/// the handler reach it through one reference instead of copying the route's settings and
/// looking its backend, header policy and TLS up by prefix on every request.
final class FastRoute: Sendable {
    let route: RouteSettings
    let backend: RouteBackend
    let policy: RelayHeaderPolicy
    /// For an https backend; `nil` for plain http.
    let tls: BackendTLS?
    /// The pool key of the backend's connections (`BackendTLS.poolKey` for https).
    let poolKey: String
    /// The `Host` header the backend is sent.
    let hostHeader: String
    /// The largest body the fast path reads itself: the route's limit, at most 64 KiB.
    let maximumFastBody: Int
    /// The route's identity kind is `session`: it knows its callers only through sealed sessions.
    let sessionOnly: Bool
    /// The route's `timeout`.
    let timeout: TimeAmount

    convenience init?(route: RouteSettings, relay: RelayServices, configuration: GatehouseConfiguration) {
        guard route.authorization != .assertion, let backend = relay.backends[route.prefix],
              let policy = relay.policies[route.prefix] else { return nil }
        let tls = relay.backendTLS[route.prefix]
        if backend.isTLS && tls?.context == nil { return nil }
        self.init(route: route, backend: backend, policy: policy, tls: tls,
                  sessionOnly: configuration.upstreams[route.upstream]?.identity?.kind == .session)
    }

    init(route: RouteSettings, backend: RouteBackend, policy: RelayHeaderPolicy, tls: BackendTLS?, sessionOnly: Bool) {
        self.route = route
        self.backend = backend
        self.policy = policy
        self.tls = tls
        self.poolKey = tls?.poolKey ?? backend.key
        let host = backend.host.contains(":") ? "[\(backend.host)]" : backend.host
        self.hostHeader = backend.port == (backend.isTLS ? 443 : 80) ? host : "\(host):\(backend.port)"
        self.maximumFastBody = min(route.maximumBodyBytes, FastRelayPlanner.maximumBody)
        self.sessionOnly = sessionOnly
        self.timeout = .nanoseconds(route.timeout.inNanoseconds)
    }
}

/// A relayed request the event loop can answer on its own: everything about it is known
/// without waiting (a body of at most 64 KiB, a cached identity that passes the route's rule).
/// Everything else goes the general way, through Hummingbird.
struct FastRelayPlan {
    let target: FastRoute
    let head: HTTPRequestHead
    let requestID: String
    /// The app's own plain `X-Request-Id`, for the log line.
    let clientRequestID: String?
    let isHead: Bool
    /// The body's length (`Content-Length`; 0 without a body): read whole before the backend
    /// is contacted, so a client that stops mid-body never produces a request at the backend.
    let bodyLength: Int
    /// The app's path, for logs and the `instance` of problems.
    let path: String
    /// A DPoP-bound token's proof, new to this instance: its `jti` is written to the store, and
    /// found new there, before the request reaches the backend (`nil` for other tokens, and for
    /// a proof whose instance-bound nonce already made memory's answer final).
    var proofRecord: FastProofRecord? = nil
    /// An ingress's question answered here (`forward_auth:`): this answer is written, and no
    /// backend is contacted (`head` is then the question's).
    var answer: HTTPResponseHead? = nil
    /// When a decision answered here was planned: its duration runs from then.
    var decidedAt: NIODeadline? = nil

    /// Sent again on a fresh connection when a pooled one turns out closed (RFC 9110 §9.2.2):
    /// a POST or PATCH is never sent twice.
    var isIdempotent: Bool {
        switch head.method {
        case .GET, .HEAD, .PUT, .DELETE, .OPTIONS: true
        default: false
        }
    }
}

/// Who the caller of a request the fast path takes is (`FastRelayPlanner.caller`).
struct FastCaller {
    let identity: CallerIdentity
    /// The token the identity was found under: the app's, or its sealed session's upstream token.
    let token: String
    let sealed: Bool
    let proofRecord: FastProofRecord?

    /// The token the backend gets in place of the app's `Authorization` on `route`: a sealed
    /// session's upstream token on a `passthrough` route (the token-handler pattern), else none
    /// (the fast path never takes an `assertion` route). `RelayFace.replacedAuthorization` is
    /// the general path's.
    func replacedAuthorization(on route: RouteSettings) -> String? {
        sealed && route.authorization == .passthrough ? token : nil
    }
}

/// The first use of a proof, to be written to the store by the `DPoPEnforcement` that checked
/// it (the plan carries it: a reload may swap the planner while the exchange waits).
struct FastProofRecord: Sendable {
    let spend: DPoPEnforcement.ProofSpend
    let dpop: DPoPEnforcement
}

/// Decides, synchronously and on the event loop, whether a request takes the fast path. The
/// decision itself is `RelayAdmission`, shared with the general path; this adds only what the
/// fast path can carry out (HTTP/1.1, a body framed by `Content-Length` of at most 64 KiB and
/// the route's limit, no `Expect`, no assertion to sign, a cached identity, a subject within
/// `relay_per_subject`). A refused request goes the general way, which answers it with the same
/// refusal (or the 429).
///
/// While tracing is on the planner declines everything: only the general path has spans.
final class FastRelayPlanner: Sendable {
    /// The largest request body the fast path reads itself.
    static let maximumBody = 64 * 1024

    let configuration: GatehouseConfiguration
    let relay: RelayServices
    let sessions: SessionServices?
    let limits: RateLimiters?
    /// Checks the proofs of DPoP-bound tokens; `nil`: such tokens go the general way.
    let dpop: DPoPEnforcement?
    let tracingEnabled: Bool
    let logger: Logger
    /// By position in `configuration.routes`; `nil` for a route the fast path never takes.
    private let routes: [FastRoute?]

    init(configuration: GatehouseConfiguration, relay: RelayServices, sessions: SessionServices?, limits: RateLimiters? = nil,
         dpop: DPoPEnforcement? = nil, tracingEnabled: Bool = false, logger: Logger) {
        self.configuration = configuration
        self.relay = relay
        self.sessions = sessions
        self.limits = limits
        self.dpop = dpop
        self.tracingEnabled = tracingEnabled
        self.logger = logger
        self.routes = configuration.routes.map { FastRoute(route: $0, relay: relay, configuration: configuration) }
    }

    func plan(_ request: HTTPRequestHead, remoteAddress: String?, memo: inout ConnectionMemo) -> FastRelayPlan? {
        guard !tracingEnabled, request.version == .http1_1 else { return nil }
        let target = request.uri
        let pathEnd = target.utf8.firstIndex(of: UInt8(ascii: "?")) ?? target.endIndex
        let path = String(target[..<pathEnd])
        if let forwardAuth = configuration.forwardAuth, ForwardAuthFace.owns(path) {
            return decision(request, path: path, settings: forwardAuth, remoteAddress: remoteAddress, memo: &memo)
        }
        guard let index = configuration.routeIndex(for: path), let fast = routes[index] else { return nil }
        let route = fast.route
        let head = NIORelayHead(head: request)
        guard case .success(let admission) = RelayAdmission.admit(head, route: route, backendPath: fast.backend.basePath),
              head.values(of: .expect).isEmpty,
              !admission.connectionTokens.contains("close"), !admission.connectionTokens.contains("upgrade") else { return nil }
        let bodyLength: Int
        switch admission.body {
        case .none: bodyLength = 0
        case .length(let length) where length <= fast.maximumFastBody && Self.mayCarryBody(request.method): bodyLength = length
        case .length, .chunked: return nil
        }
        guard let caller = caller(admission, head: head, method: request.method, path: path, fast: fast, memo: &memo) else { return nil }
        let identity = caller.identity

        let requestID = RequestIDGenerator.shared.next()
        let clientRequestID = head.requestID.flatMap(RelayForwarding.acceptableClientRequestID)
        var headers = fast.policy.outboundHeaders(
            from: head, connectionTokens: admission.connectionTokens, identity: identity,
            authorization: caller.replacedAuthorization(on: route),
            host: fast.hostHeader, forwarding: relay.forwarding,
            peer: memo.peer(remoteAddress, forwarding: relay.forwarding), requestID: requestID, clientRequestID: clientRequestID)
        if bodyLength > 0 || Self.announcesEmptyBody(request.method) {
            headers.add(name: "Content-Length", value: String(bodyLength))
        }
        let outbound = HTTPRequestHead(version: .http1_1, method: request.method, uri: admission.target, headers: headers)
        return FastRelayPlan(target: fast, head: outbound, requestID: requestID, clientRequestID: clientRequestID,
                             isHead: request.method == .HEAD, bodyLength: bodyLength, path: path, proofRecord: caller.proofRecord)
    }

    /// The caller of an admitted request, when the fast path can know it without waiting: a
    /// bearer token (or a sealed session opened moments ago, or, when `allowsProof`, a DPoP-bound
    /// one with its proof) whose identity is cached, passes the route's rule and is within
    /// `relay_per_subject`. `nil` sends the request the general way, which answers it.
    private func caller(_ admission: RelayAdmission, head: NIORelayHead, method: HTTPMethod, path: String, fast: FastRoute,
                        allowsProof: Bool = true, memo: inout ConnectionMemo) -> FastCaller? {
        let route = fast.route
        var token = admission.bearer
        var sealed = false
        var boundThumbprint: String?
        // Web-session cookies (CSRF) go the general way; so does any token in the wrong scheme,
        // which the general path refuses with its precise answer.
        let bound = token.hasPrefix(SessionServices.boundAccessPrefix)
        guard admission.scheme == (bound ? .dpop : .bearer), !token.hasPrefix(SessionServices.cookiePrefix), allowsProof || !bound else { return nil }
        if token.hasPrefix(SessionServices.accessPrefix) || bound {
            // Only a session opened moments ago by the general path, and not due for refresh.
            let now = Date()
            guard let sessions, let view = SealedMemo.view(of: token, in: sessions.views, now: now, memo: &memo.sealed),
                  view.upstream == route.upstream, !sessions.needsRefresh(view, now: now) else { return nil }
            if bound {
                guard let key = view.dpopJKT else { return nil }
                boundThumbprint = key
            }
            token = view.tokens.accessToken.reveal()
            // It goes into a header the fast path writes without NIO's validation.
            guard RelayAdmission.isHeaderSafeToken(token) else { return nil }
            sealed = true
        } else if token.hasPrefix(SessionServices.refreshPrefix) {
            return nil
        } else if fast.sessionOnly {
            // Such a route knows its callers only through their sealed session.
            return nil
        }
        guard case .active(let identity) = relay.cache.peek(key: memo.key(of: token, upstream: route.upstream)),
              admission.authorize(identity) == nil else { return nil }
        // A bound token's proof, once every cheaper check has passed: for this method and URI,
        // this token, the session's key, fresh, with the nonce when required, and not seen here
        // before (a replay never takes the caller's rate-limit tokens; the general path refuses it).
        var proof: VerifiedDPoPProof?
        if let boundThumbprint {
            guard let dpop, let checked = dpop.fastPathProof(head.dpop, method: method.rawValue, path: path, token: admission.bearer,
                                                             boundThumbprint: boundThumbprint), !dpop.hasSeen(checked) else { return nil }
            proof = checked
        }
        // Last: a token is taken only for a request the fast path will carry. Over the limit, the
        // general path takes again, is refused too, and answers (and counts) the 429.
        if let limits, limits.take(.relay_subject, key: RateLimiters.relaySubjectKey(identity, token: token), recording: false) != nil { return nil }
        // And the proof's jti after it (the store is asked before the backend: `.admit`).
        var proofRecord: FastProofRecord?
        if let proof, let dpop {
            switch dpop.remember(proof) {
            case .replayed: return nil
            case .spent: break
            case .toRecord(let spend): proofRecord = FastProofRecord(spend: spend, dpop: dpop)
            }
        }
        return FastCaller(identity: identity, token: token, sealed: sealed, proofRecord: proofRecord)
    }

    /// An ingress's question (`forward_auth:`) answered on the event loop: from a trusted proxy,
    /// with no body, about a request the fast path would relay (a bearer token or a sealed
    /// session's, identity cached, rule passed, within `relay_per_subject`). The answer is the
    /// general path's allow (`ForwardAuthAllow`); every other question, and every refusal, goes
    /// the general way (`ForwardAuthFace`), which answers it.
    private func decision(_ request: HTTPRequestHead, path: String, settings: ForwardAuthSettings, remoteAddress: String?,
                          memo: inout ConnectionMemo) -> FastRelayPlan? {
        let decidedAt = NIODeadline.now()
        guard settings.trusts(remoteAddress) else { return nil }
        let envoyTarget: String?
        switch ForwardAuthFace.question(path: path, rawTarget: request.uri) {
        case .ingress: envoyTarget = nil
        case .envoy(let target): envoyTarget = target
        case .refusal, nil: return nil
        }
        let own = NIORelayHead(head: request)
        guard own.values(of: .transferEncoding).isEmpty, own.values(of: .expect).isEmpty,
              own.values(of: .contentLength).allSatisfy({ $0 == "0" }),
              !own.values(of: .connection).contains(where: { $0.lowercased().contains("close") || $0.lowercased().contains("upgrade") })
        else { return nil }
        // Whatever the general path refuses goes to it (a question through the public host, a
        // header the backend would read as another method, URL or user).
        guard ForwardedRequest.screen(authority: request.headers.first(name: "host"), publicAuthority: relay.forwarding.host,
                                      publicScheme: relay.forwarding.proto, names: request.headers.lazy.map(\.name)) == nil
        else { return nil }
        let fields: ForwardedRequest.Fields = { name in request.headers[name] }
        guard case .success(let original) = ForwardedRequest.read(fields, ownMethod: request.method.rawValue, envoyTarget: envoyTarget)
        else { return nil }
        let method = HTTPMethod(rawValue: original.method)
        // The app's request as the relay would have seen it: its method and target, the client's
        // headers the ingress passed, none of the question's own framing.
        var appHeaders = HTTPHeaders()
        for (name, value) in request.headers where !Self.isFraming(name) { appHeaders.add(name: name, value: value) }
        let appRequest = HTTPRequestHead(version: .http1_1, method: method, uri: original.target, headers: appHeaders)
        let appPathEnd = original.target.utf8.firstIndex(of: UInt8(ascii: "?")) ?? original.target.endIndex
        let appPath = String(original.target[..<appPathEnd])
        guard let index = configuration.routeIndex(for: appPath), let fast = routes[index] else { return nil }
        let route = fast.route
        let head = NIORelayHead(head: appRequest)
        guard case .success(let admission) = RelayAdmission.admit(head, route: route, backendPath: fast.backend.basePath),
              let caller = caller(admission, head: head, method: method, path: appPath, fast: fast, allowsProof: false, memo: &memo)
        else { return nil }
        let authorization = ForwardAuthAllow.authorization(route: route, replaced: caller.replacedAuthorization(on: route),
                                                           scheme: admission.scheme, appHeader: head.values(of: .authorization).first)
        let seconds = ForwardAuthAllow.cacheSeconds(scheme: admission.scheme, maxAge: settings.maxAge,
                                                    cacheTTL: configuration.upstreams[route.upstream]?.identity?.cacheTTL,
                                                    expiresAt: caller.identity.expiresAt, now: Date())
        let requestID = RequestIDGenerator.shared.next()
        var answer = HTTPHeaders()
        for (name, value) in ForwardAuthAllow.headers(route: route, identity: caller.identity, authorization: authorization, cacheSeconds: seconds) {
            answer.add(name: name, value: value)
        }
        answer.add(name: "X-Request-Id", value: requestID)
        return FastRelayPlan(target: fast, head: request, requestID: requestID,
                             clientRequestID: own.requestID.flatMap(RelayForwarding.acceptableClientRequestID), isHead: request.method == .HEAD,
                             bodyLength: 0, path: path, answer: HTTPResponseHead(version: .http1_1, status: .ok, headers: answer),
                             decidedAt: decidedAt)
    }

    /// The question's own framing fields: never the app's (a decision reads no body).
    private static func isFraming(_ name: String) -> Bool {
        RelayHeaderPolicy.isNamed(name, "content-length") || RelayHeaderPolicy.isNamed(name, "transfer-encoding")
            || RelayHeaderPolicy.isNamed(name, "expect") || RelayHeaderPolicy.isNamed(name, "connection")
    }

    /// A body on GET, HEAD or OPTIONS goes the general way: backends that ignore such a body
    /// would read it from a pooled connection as the next request (a desync the fast path's
    /// shared connections must never carry).
    private static func mayCarryBody(_ method: HTTPMethod) -> Bool {
        switch method {
        case .GET, .HEAD, .OPTIONS: false
        default: true
        }
    }

    /// Methods whose empty body is announced with `Content-Length: 0` (RFC 9110 §8.6: a request
    /// with a method that defines a body's meaning); NIO's encoder would otherwise add
    /// `Transfer-Encoding: chunked` to them.
    private static func announcesEmptyBody(_ method: HTTPMethod) -> Bool {
        switch method {
        case .POST, .PUT, .PATCH: true
        default: false
        }
    }
}

/// What a connection's fast path keeps from one request to the next. A connection usually
/// carries one app's requests, with one token, from one peer: the next request skips hashing
/// the token (twice for a sealed one) and formatting the forwarding headers.
struct ConnectionMemo {
    var sealed: SealedMemo?
    /// The identity-cache key of the last token looked up, and for which token and upstream.
    private var lastKey: (token: String, upstream: String, key: TokenKey)?
    private var lastPeer: RelayForwarding.Peer?

    mutating func key(of token: String, upstream: String) -> TokenKey {
        // Compared byte for byte: `==` on strings is Unicode equivalence ("K" == "\u{212A}").
        if let lastKey, lastKey.token.utf8.elementsEqual(token.utf8), lastKey.upstream == upstream { return lastKey.key }
        let key = TokenKey(token: token, upstream: upstream)
        lastKey = (token, upstream, key)
        return key
    }

    mutating func peer(_ remoteAddress: String?, forwarding: RelayForwarding) -> RelayForwarding.Peer {
        if let lastPeer, lastPeer.remoteAddress == remoteAddress { return lastPeer }
        let peer = forwarding.peer(remoteAddress)
        lastPeer = peer
        return peer
    }
}

/// The last sealed token a connection relayed and the session view it stood for, kept by the
/// connection's fast path: a connection usually carries one app's token, and its next request
/// then skips hashing the token and the session cache's lock. The copy is used only while the
/// cache entry it came from would be (its `until`) and while nothing was dropped from or
/// replaced in that cache since (a revocation, a refresh): then the cache is asked again.
struct SealedMemo {
    let token: String
    let view: SessionServices.SessionView
    let until: Date
    let generation: UInt64
    let cache: ObjectIdentifier

    /// The view of the sealed `token`: from `memo` when it still holds, else from `cache`
    /// (and `memo` now keeps it); `nil` when the cache has no view of the token.
    static func view(of token: String, in cache: SessionViewCache, now: Date, memo: inout SealedMemo?) -> SessionServices.SessionView? {
        if let kept = memo, kept.until > now, kept.token.utf8.elementsEqual(token.utf8), kept.cache == ObjectIdentifier(cache),
           kept.generation == cache.generation {
            return kept.view
        }
        let generation = cache.generation  // before the read: a change after it makes the copy stale
        guard let (view, until) = cache.entry(SecureToken.hash(token), now: now) else {
            memo = nil
            return nil
        }
        memo = SealedMemo(token: token, view: view, until: until, generation: generation, cache: ObjectIdentifier(cache))
        return view
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
    /// The `DPoP` proofs (RFC 9449 §4.1), for a bound token.
    private(set) var dpop: [String] = []

    init(head: HTTPRequestHead) {
        self.head = head
        for (name, value) in head.headers {
            switch name.utf8.count {
            case 4 where RelayHeaderPolicy.isNamed(name, "dpop"): dpop.append(value)
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
