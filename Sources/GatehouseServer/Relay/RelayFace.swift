import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseUpstreams
import Hummingbird
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL
import ServiceContextModule
import Tracing

/// The resource relay's general path (the fast path in FastRelay/ carries out the same decisions
/// for what it takes): admission, the caller's identity, the route's rule, the backend call.
struct RelayFace: GatehouseFeature {
    let configuration: GatehouseConfiguration
    let upstreams: [String: any UpstreamProfile]
    let logger: Logger
    let limits: RateLimiters
    let dpop: DPoPEnforcement
    let services: RelayServices
    /// Sealed sessions, when configured: a Gatehouse token stands for its session's upstream token.
    let sealedSessions: SealedSessions?
}

extension RelayFace {
    /// Bodies up to this size are read whole and sent with a length; larger ones stream.
    static let bufferedBodyLimit = 64 * 1024

    /// `ANY {route.prefix}/…` (myVOO steps 1a–1c, 6a–6b): the general path. The admission
    /// (`decide`), then the relay to the backend, streaming.
    func serve<Context: GatehouseRequestContextProtocol>(_ request: Request, context: Context, route: RouteSettings) async -> Response {
        let limits = self.limits
        let decision = await decide(request, route: route, htu: issuer + request.uri.path,
                                    clientAddress: { limits.clientAddress(peer: context.remoteAddress, headers: request.headers) })
        let admitted: Admitted
        switch decision {
        case .refused(let response): return response
        case .admitted(let decided): admitted = decided
        }
        let relay = services
        let admission = admitted.admission, identity = admitted.identity, backend = admitted.backend
        let url = backend.origin + admission.target
        guard Self.isCarriedFaithfully(url: url, target: admission.target) else {
            return .problem(.badRequest("The path cannot be relayed as it was sent."), for: request)
        }
        let head = HummingbirdRelayHead(request: request)
        do {
            let authorization = try await replacedAuthorization(admitted, route: route)
            var outbound = HTTPClientRequest(url: url)
            outbound.method = HTTPMethod(rawValue: request.method.rawValue)
            outbound.tlsConfiguration = relay.backendTLS[route.prefix]?.configuration
            outbound.headers = admitted.policy.outboundHeaders(from: head, connectionTokens: admission.connectionTokens, identity: identity,
                                                               authorization: authorization, host: nil, forwarding: relay.forwarding,
                                                               peer: relay.forwarding.peer(context.remoteAddress), requestID: context.requestID,
                                                               clientRequestID: context.clientRequestID)
            if admission.expectsContinue { await context.sendContinue() }
            try await attachBody(admission.body, of: request, to: &outbound, route: route)
            let response = try await backendCall(outbound, backend: backend, route: route, client: relay.backendClient)
            return try await Self.inboundResponse(response, isHead: request.method == .head)
        } catch let error as RelayBodyTooLarge {
            return .problem(.payloadTooLarge(limit: error.limit), for: request)
        } catch is RelayClientBodyError {
            logger.info("request body malformed", metadata: ["route": .string(route.prefix)])
            return .problem(.badRequest("The request body is malformed."), for: request)
        } catch let error as HTTPClientError where error == .deadlineExceeded {
            logger.warning("backend timeout", metadata: ["route": .string(route.prefix)])
            return .problem(.backendTimeout(), for: request)
        } catch {
            logger.warning("backend unavailable", metadata: ["route": .string(route.prefix), "error_type": .string(String(describing: type(of: error)))])
            return .problem(.backendUnavailable(), for: request)
        }
    }

    /// What the admission decided: the relay's answer, or the caller admitted on the route.
    enum Decision {
        case refused(Response)
        case admitted(Admitted)
    }

    /// A request admitted on its route: who the caller is, and what the backend may be sent.
    struct Admitted {
        let admission: RelayAdmission
        let identity: CallerIdentity
        /// The token the identity service was asked about: the app's, or its sealed session's upstream token.
        let upstreamToken: String
        /// Whether the app's token was a Gatehouse (sealed session) token.
        let sealed: Bool
        let backend: RouteBackend
        let policy: RelayHeaderPolicy
    }

    /// The one admission of the resource relay, run for every relayed request and for every
    /// decision asked by an ingress (`ForwardAuthFace`): the same admission as the fast path
    /// (`RelayAdmission`: method, target, framing, token), then the token (sealed sessions
    /// refreshed when due, DPoP proofs checked against `htu`), the caller resolved once (cached),
    /// the route's rule and the rate limits. It reads no body and contacts no backend.
    /// - Parameters:
    ///   - htu: the URL the app called, without query: what a DPoP proof must name.
    ///   - clientAddress: the client's address as the limits count it, worked out only when a limit needs it.
    func decide(_ request: Request, route: RouteSettings, htu: String, clientAddress: () -> String?) async -> Decision {
        let relay = services
        guard let identitySettings = configuration.upstreams[route.upstream]?.identity,
              let backend = relay.backends[route.prefix], let policy = relay.policies[route.prefix] else {
            return .refused(.problem(.notFound(), for: request))
        }
        let resolver = relay.resolvers[route.upstream]
        guard resolver != nil || identitySettings.kind == .session else { return .refused(.problem(.notFound(), for: request)) }
        let head = HummingbirdRelayHead(request: request)
        let admission: RelayAdmission
        let sessionCookie = route.acceptSessionCookie ? RelayHeaderPolicy.sessionCookie(in: request.headers[values: .cookie]) : nil
        switch RelayAdmission.admit(head, route: route, backendPath: backend.basePath, sessionCookie: sessionCookie) {
        case .success(let admitted): admission = admitted
        case .failure(.signIn(let detail)): return .refused(signInAgain(request, route: route, detail: detail))
        case .failure(.problem(let problem, let allow)):
            return .refused(.problem(problem, for: request, allow: allow.compactMap { HTTPRequest.Method($0) }))
        }
        let token = admission.bearer
        // A Gatehouse token (sealed session) stands for the session's upstream token, which is
        // what the identity service is asked about and what the backend may receive.
        var upstreamToken = token
        var sealed = false
        var sealedView: SessionServices.SessionView?
        if token.hasPrefix(SessionServices.refreshPrefix) {
            // A Gatehouse refresh token is never a bearer token, and never leaves Gatehouse.
            return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked."))
        }
        if let refusal = refusingCredential(admission, token: token, request: request, route: route) { return .refused(refusal) }
        if SessionServices.isAccessToken(token) {
            guard let sessions = sealedSessions?.services else { return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")) }
            if let refused = refusingOverSessionLookupLimit(token: token, request: request, clientAddress: clientAddress) { return .refused(refused) }
            switch await sessions.upstreamAccessToken(forGatehouseToken: token, upstreams: upstreams) {
            case .fresh(let view) where view.upstream == route.upstream:
                if token.hasPrefix(SessionServices.boundAccessPrefix),
                   let refusal = await dpop.refusingBoundToken(request, token: token, scheme: admission.scheme, boundThumbprint: view.dpopJKT, htu: htu) {
                    return .refused(refusal)
                }
                upstreamToken = view.tokens.accessToken.reveal()
                sealed = true
                sealedView = view
            case .fresh, .ended:
                return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked."))
            case .unavailable(let retryAfter):
                return .refused(.unavailable(.identityUnavailable(), for: request, retryAfter: retryAfter))
            }
        }
        var resolution: IdentityResolution
        if identitySettings.kind == .session {
            // Who signed in is in the sealed session, verified at sign-in: no identity call.
            guard let view = sealedView, let userinfo = view.userinfo,
                  let identity = SessionIdentity.identity(fromUserinfo: userinfo, settings: identitySettings) else {
                return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked."))
            }
            resolution = .active(identity)
            // For the fast path, which finds identities by upstream token.
            relay.cache.insert(resolution, forToken: upstreamToken, upstream: route.upstream, ttl: identitySettings.cacheTTL)
        } else if let resolver {
            // A sealed session's token was found in the store: never junk, never limited per address.
            if !sealed, let refusal = refusingOverLookupLimit(token: upstreamToken, upstream: route.upstream, request: request, clientAddress: clientAddress) {
                return .refused(refusal)
            }
            do {
                resolution = try await relay.cache.resolve(token: upstreamToken, upstream: route.upstream, ttl: identitySettings.cacheTTL,
                                                           negativeTTL: identitySettings.negativeTTL, resolver: resolver)
                if resolution == .inactive, let sessions = sealedSessions?.services, let view = sealedView, view.upstreamExpiresAt == nil {
                    // The upstream gave no `expires_in`, so Gatehouse could not refresh ahead of time:
                    // refresh once now rather than send the app to sign in again.
                    let refreshed: SessionServices.SessionView
                    switch await sessions.refresh(sessionID: view.sessionID, knownVersion: view.version, upstreams: upstreams) {
                    case .fresh(let view): refreshed = view
                    case .ended: return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked."))
                    case .unavailable(let retryAfter):
                        // Only invalid_grant ends a session: an upstream that cannot refresh now is an outage.
                        return .refused(.unavailable(.identityUnavailable(), for: request, retryAfter: retryAfter))
                    }
                    sessions.views.dropSession(view.sessionID, revoked: false)
                    upstreamToken = refreshed.tokens.accessToken.reveal()
                    resolution = try await relay.cache.resolve(token: upstreamToken, upstream: route.upstream, ttl: identitySettings.cacheTTL,
                                                               negativeTTL: identitySettings.negativeTTL, resolver: resolver)
                }
            } catch {
                return .refused(identityUnavailable(error, route: route, request: request))
            }
        } else {
            return .refused(.problem(.notFound(), for: request))
        }
        guard case .active(let identity) = resolution else {
            return .refused(signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked."))
        }
        if let problem = admission.authorize(identity) {
            return .refused(.problem(problem, for: request))
        }
        if let refusal = refusingOverSubjectLimit(identity, token: upstreamToken, clientID: sealedView?.clientID, request: request) {
            return .refused(refusal)
        }
        return .admitted(Admitted(admission: admission, identity: identity, upstreamToken: upstreamToken, sealed: sealed,
                                  backend: backend, policy: policy))
    }

    /// The `Authorization` the backend gets in place of the app's: a signed assertion
    /// (`authorization: assertion`), or a sealed session's upstream token (`passthrough`, the
    /// token-handler pattern); `nil` to leave the app's header to the route's policy.
    func replacedAuthorization(_ admitted: Admitted, route: RouteSettings) async throws -> String? {
        if route.authorization == .assertion, let signer = services.signer {
            return try await signer.assertion(for: admitted.identity, audience: route.backend)
        } else if admitted.sealed, route.authorization == .passthrough {
            return admitted.upstreamToken
        }
        return nil
    }

    /// The backend call in a client span `backend <route label>` (no URL, no query: the host
    /// and the status only), with the span's `traceparent` sent to the backend.
    private func backendCall(_ outbound: HTTPClientRequest, backend: RouteBackend, route: RouteSettings,
                             client: HTTPClient) async throws -> HTTPClientResponse {
        var outbound = outbound
        return try await withSpan("backend " + RouteLabel.of(route), ofKind: .client) { span in
            span.attributes["server.address"] = backend.host
            InstrumentationSystem.instrument.inject(ServiceContext.current ?? .topLevel, into: &outbound.headers, using: BackendHeadersInjector())
            let response = try await client.execute(outbound, timeout: .nanoseconds(route.timeout.inNanoseconds))
            span.attributes["http.response.status_code"] = Int(response.status.code)
            return response
        }
    }

    /// 503 when the identity service cannot answer: `Retry-After: 1` when it is only busy
    /// (`identity_concurrency` calls already in flight, none made), 5 s otherwise.
    private func identityUnavailable(_ error: IdentityUnavailable, route: RouteSettings, request: Request) -> Response {
        var response = Response.unavailable(.identityUnavailable(), for: request)
        if error.reason == .overloaded {
            // Counted (`identity_concurrency`) where the call was refused: by the resolver's limit.
            logger.notice("identity service busy: request refused", metadata: ["upstream": .string(route.upstream)])
            response.headers[.retryAfter] = "1"
        } else {
            logger.warning("identity service unavailable", metadata: ["upstream": .string(route.upstream), "reason": .string(error.reason.rawValue)])
        }
        return response
    }

    /// Chunked bodies are read whole, before the backend is contacted, on routes whose
    /// `max_body_bytes` is at most this: an over-limit body is a 413 that nothing reached.
    /// On routes that take larger bodies they stream, and an over-limit body aborts the
    /// backend request mid-body (the backend never sees a complete request).
    static let bufferedChunkedLimit = 1024 * 1024

    private func attachBody(_ body: RelayAdmission.Body, of request: Request, to outbound: inout HTTPClientRequest,
                            route: RouteSettings) async throws {
        var request = request
        switch body {
        case .none:
            return
        case .length(let length) where length <= Self.bufferedBodyLimit:
            outbound.body = .bytes(try await Self.collect(&request, upTo: length, limit: route.maximumBodyBytes))
        case .chunked where route.maximumBodyBytes <= Self.bufferedChunkedLimit:
            outbound.body = .bytes(try await Self.collect(&request, upTo: route.maximumBodyBytes, limit: route.maximumBodyBytes))
        case .length(let length):
            outbound.body = .stream(RelayRequestBody(base: request.body, limit: route.maximumBodyBytes), length: .known(Int64(length)))
        case .chunked:
            outbound.body = .stream(RelayRequestBody(base: request.body, limit: route.maximumBodyBytes), length: .unknown)
        }
    }

    /// The whole body, or `RelayBodyTooLarge` past `upTo`, or `RelayClientBodyError` when the
    /// client's framing breaks.
    private static func collect(_ request: inout Request, upTo maximum: Int, limit: Int) async throws -> ByteBuffer {
        do {
            return try await request.collectBody(upTo: maximum)
        } catch let error as HTTPError where error.status == .contentTooLarge {
            throw RelayBodyTooLarge(limit: limit)
        } catch is NIOTooManyBytesError {
            throw RelayBodyTooLarge(limit: limit)
        } catch {
            throw RelayClientBodyError()
        }
    }

    /// Whether AsyncHTTPClient sends `url` with exactly `target` as request target. It parses
    /// the URL with Foundation (a path Foundation cannot decode becomes `/`); this is the same
    /// computation, so anything it would change is refused rather than sent elsewhere.
    static func isCarriedFaithfully(url: String, target: String) -> Bool {
        guard let parsed = URL(string: url), !parsed.path.isEmpty else { return false }
        var sent = URLComponents(url: parsed, resolvingAgainstBaseURL: true)?.percentEncodedPath ?? parsed.path
        if let query = parsed.query { sent += "?" + query }
        return sent == target
    }

    /// 401 with `WWW-Authenticate: Bearer error="invalid_token"` and where to sign in again.
    /// Each kind of token only through its own channel: a web-session token only in the cookie
    /// (and, for a method that changes something, only from a page of Gatehouse or of
    /// `webviews.origins`: CSRF), a DPoP-bound token only with `Authorization: DPoP`, and the
    /// `DPoP` scheme only for a DPoP-bound token.
    private func refusingCredential(_ admission: RelayAdmission, token: String, request: Request, route: RouteSettings) -> Response? {
        switch admission.scheme {
        case .cookie:
            guard token.hasPrefix(SessionServices.cookiePrefix) else {
                return signInAgain(request, route: route, detail: "The session cookie is invalid, expired or revoked.")
            }
            // The cookie carries the user's identity only for requests that pass the CSRF rule:
            // whatever the method, a request that names a foreign Origin is refused (a page elsewhere
            // reading or probing with the user's cookie); without an Origin, only a navigation-like
            // GET, HEAD or OPTIONS goes through on the cookie alone.
            let safe = ["GET", "HEAD", "OPTIONS"].contains(request.method.rawValue)
            guard (safe && request.headers[values: .origin].isEmpty) || isSameSite(request) else {
                return .problem(.forbidden("A request with the session cookie from another site's page (Origin), or that changes something without naming this site's page, is refused."),
                                for: request)
            }
        case .dpop:
            guard token.hasPrefix(SessionServices.boundAccessPrefix) else {
                return dpop.refusal(request, error: "invalid_token", detail: "Only a DPoP-bound access token is sent with the DPoP scheme.")
            }
        case .bearer:
            if token.hasPrefix(SessionServices.boundAccessPrefix) {
                return dpop.refusal(request, error: "invalid_token",
                                   detail: "The access token is bound to a DPoP key: send it as Authorization: DPoP with a proof.")
            }
            if token.hasPrefix(SessionServices.cookiePrefix) {
                return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")
            }
        }
        return nil
    }

    /// CSRF: the request's `Origin` (or, without one, its `Referer`'s origin) is Gatehouse's own or one of `webviews.origins`.
    private func isSameSite(_ request: Request) -> Bool {
        let allowed = Set([GatehouseConfiguration.webOrigin(issuer) ?? issuer] + (configuration.webviews?.origins ?? []))
        let origins = request.headers[values: .origin]
        if !origins.isEmpty {
            return origins.count == 1 && GatehouseConfiguration.webOrigin(origins[0]).map(allowed.contains) == true
        }
        guard let referer = request.headers[values: .referer].first, let components = URLComponents(string: referer) else { return false }
        var origin = components
        origin.path = ""
        origin.query = nil
        origin.fragment = nil
        return origin.string.flatMap(GatehouseConfiguration.webOrigin).map(allowed.contains) == true
    }

    private func signInAgain(_ request: Request, route: RouteSettings, detail: String) -> Response {
        let endpoint = issuer + "/oauth/authorize"
        let url = route.signInClientID.map {
            RedirectURI.appending([("response_type", "code"), ("client_id", $0)], to: endpoint)
        }
        var response = Response.problem(.invalidToken(detail), for: request,
                                        signIn: .init(authorization_endpoint: endpoint, client_id: route.signInClientID, url: url))
        response.headers[.wwwAuthenticate] = #"Bearer realm="gatehouse", error="invalid_token", error_description="\#(detail)""#
        return response
    }

    private static func inboundResponse(_ response: HTTPClientResponse, isHead: Bool) async throws -> Response {
        var headers = HTTPFields()
        let connectionValues = response.headers["connection"]
        let connectionTokens = connectionValues.isEmpty ? [] : RelayHeaderPolicy.connectionTokens(connectionValues)
        var contentLength: Int?
        for (name, value) in response.headers {
            let lowercased = name.lowercased()
            if lowercased == "content-length" { contentLength = Int(value) }
            guard RelayHeaderPolicy.forwardsResponseHeader(lowercased, connectionTokens: connectionTokens),
                  let fieldName = HTTPField.Name(name) else { continue }
            headers.append(HTTPField(name: fieldName, value: value))
        }
        let status = HTTPResponse.Status(code: Int(response.status.code), reasonPhrase: response.status.reasonPhrase)
        if isHead {
            if let contentLength { headers[.contentLength] = String(contentLength) }
            return Response(status: status, headers: headers, body: ResponseBody())
        }
        if let contentLength, contentLength <= bufferedBodyLimit {
            // Small bodies go out in one write with their head: fewer syscalls, no streaming task.
            let buffer = try await response.body.collect(upTo: contentLength)
            return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: buffer))
        }
        let body = response.body
        return Response(status: status, headers: headers, body: ResponseBody(contentLength: contentLength) { writer in
            for try await buffer in body {
                try await writer.write(buffer)
            }
            try await writer.finish(nil)
        })
    }
}

/// The app's request body on its way to the backend, refused past the route's limit.
struct RelayRequestBody: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let base: RequestBody
    let limit: Int

    struct AsyncIterator: AsyncIteratorProtocol {
        var base: RequestBody.AsyncIterator
        let limit: Int
        var seen = 0

        mutating func next() async throws -> ByteBuffer? {
            let next: ByteBuffer?
            do {
                next = try await base.next()
            } catch {
                throw RelayClientBodyError()
            }
            guard let buffer = next else { return nil }
            seen += buffer.readableBytes
            if seen > limit { throw RelayBodyTooLarge(limit: limit) }
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), limit: limit)
    }
}

struct RelayBodyTooLarge: Error {
    let limit: Int
}

/// The app's body broke off or its framing was malformed: the client's fault, a 400.
struct RelayClientBodyError: Error {}

/// A Hummingbird request as the relay's admission reads it. `rawTarget` is the request
/// target exactly as sent (HTTP types keep it undecoded in `path`).
struct HummingbirdRelayHead: RelayRequestHead {
    let request: Request

    var methodName: String { request.method.rawValue }
    var rawTarget: String { request.head.path ?? "/" }

    func values(of field: RelayHeadField) -> [String] {
        switch field {
        case .authorization: request.headers[values: .authorization]
        case .contentLength: request.headers[values: .contentLength]
        case .transferEncoding: request.headers[values: .transferEncoding]
        case .expect: request.headers[values: .expect]
        case .connection: request.headers[values: .connection]
        }
    }

    func forEachField(_ body: (String, String) -> Void) {
        for field in request.headers { body(field.name.rawName, field.value) }
    }
}
