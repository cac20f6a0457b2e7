import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseUpstreams
import Hummingbird
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1

extension Gatehouse {
    /// Bodies up to this size are read whole and sent with a length; larger ones stream.
    static let bufferedBodyLimit = 64 * 1024

    /// `ANY {route.prefix}/…` (myVOO steps 1a–1c, 6a–6b): checks the token, resolves the
    /// caller once (cached), applies the route's rule and relays to the backend, streaming.
    func relay(_ request: Request, context: GatehouseRequestContext, route: RouteSettings) async -> Response {
        guard let relay, let resolver = relay.resolvers[route.upstream],
              let identitySettings = configuration.upstreams[route.upstream]?.identity else {
            return .problem(.notFound(), for: request)
        }
        guard route.methods.contains(request.method.rawValue) else {
            return .problem(.methodNotAllowed(), for: request,
                            allow: route.methods.sorted().compactMap { HTTPRequest.Method($0) })
        }
        guard RelayHeaderPolicy.isSafe(path: request.uri.path) else {
            return .problem(.badRequest("The path has empty, '.' or '..' segments."), for: request)
        }
        guard let token = Self.bearerToken(request.headers[values: .authorization]) else {
            return signInAgain(request, route: route, detail: "The request carries no Bearer access token.")
        }
        // A Gatehouse token (sealed session) stands for the session's upstream token, which is
        // what the identity service is asked about and what the backend may receive.
        var upstreamToken = token
        var sealed = false
        var sealedView: SessionServices.SessionView?
        if token.hasPrefix(SessionServices.refreshPrefix) {
            // A Gatehouse refresh token is never a bearer token, and never leaves Gatehouse.
            return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")
        }
        if token.hasPrefix(SessionServices.accessPrefix) {
            guard let sessions else { return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.") }
            switch await sessions.upstreamAccessToken(forGatehouseToken: token, upstreams: upstreams) {
            case .fresh(let view) where view.upstream == route.upstream:
                upstreamToken = view.tokens.accessToken.reveal()
                sealed = true
                sealedView = view
            case .fresh, .ended:
                return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")
            case .unavailable:
                var response = Response.problem(.identityUnavailable(), for: request)
                response.headers[.retryAfter] = "5"
                return response
            }
        }
        var resolution: IdentityResolution
        do {
            resolution = try await relay.cache.resolve(token: upstreamToken, upstream: route.upstream, ttl: identitySettings.cacheTTL,
                                                       negativeTTL: identitySettings.negativeTTL, resolver: resolver)
            if resolution == .inactive, let sessions, let view = sealedView, view.upstreamExpiresAt == nil {
                // The upstream gave no `expires_in`, so Gatehouse could not refresh ahead of time:
                // refresh once now rather than send the app to sign in again.
                guard case .fresh(let refreshed) = await sessions.refresh(sessionID: view.sessionID, knownVersion: view.version,
                                                                          upstreams: upstreams) else {
                    return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")
                }
                sessions.views.dropSession(view.sessionID)
                upstreamToken = refreshed.tokens.accessToken.reveal()
                resolution = try await relay.cache.resolve(token: upstreamToken, upstream: route.upstream, ttl: identitySettings.cacheTTL,
                                                           negativeTTL: identitySettings.negativeTTL, resolver: resolver)
            }
        } catch {
            logger.warning("identity service unavailable", metadata: ["upstream": .string(route.upstream), "reason": .string(error.reason.rawValue)])
            var response = Response.problem(.identityUnavailable(), for: request)
            response.headers[.retryAfter] = "5"
            return response
        }
        guard case .active(let identity) = resolution else {
            return signInAgain(request, route: route, detail: "The access token is invalid, expired or revoked.")
        }
        if let violation = route.rule.violation(by: identity) {
            return .problem(.forbidden(violation.prefix(1).uppercased() + violation.dropFirst() + "."), for: request)
        }
        let contentLength = request.headers[.contentLength].flatMap { Int($0) }
        if let contentLength, contentLength > route.maximumBodyBytes {
            return .problem(.payloadTooLarge(limit: route.maximumBodyBytes), for: request)
        }
        do {
            let outbound = try await outboundRequest(request, context: context, route: route, identity: identity,
                                                     relay: relay, contentLength: contentLength,
                                                     sealedUpstreamToken: sealed ? upstreamToken : nil)
            let response = try await relay.backendClient.execute(outbound, timeout: .nanoseconds(route.timeout.inNanoseconds))
            return try await Self.inboundResponse(response, isHead: request.method == .head)
        } catch let error as RelayBodyTooLarge {
            return .problem(.payloadTooLarge(limit: error.limit), for: request)
        } catch let error as HTTPClientError where error == .deadlineExceeded {
            logger.warning("backend timeout", metadata: ["route": .string(route.prefix)])
            return .problem(.backendTimeout(), for: request)
        } catch {
            logger.warning("backend unavailable", metadata: ["route": .string(route.prefix), "error_type": .string(String(describing: type(of: error)))])
            return .problem(.backendUnavailable(), for: request)
        }
    }

    /// 401 with `WWW-Authenticate: Bearer error="invalid_token"` and where to sign in again.
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

    /// The token of a single `Authorization: Bearer …` header (RFC 6750 §2.1); `nil` otherwise.
    static func bearerToken(_ values: [String]) -> String? {
        guard values.count == 1, let value = values.first?.utf8, value.count > 7 else { return nil }
        let scheme = value.prefix(7)
        guard scheme.elementsEqual("bearer ".utf8, by: { $0 | 0x20 == $1 }) else { return nil }
        var token = value.dropFirst(7)
        while token.first == UInt8(ascii: " ") { token = token.dropFirst() }
        while token.last == UInt8(ascii: " ") { token = token.dropLast() }
        guard !token.isEmpty, token.count <= 8192, !token.contains(UInt8(ascii: " ")) else { return nil }
        return String(token)
    }

    private func outboundRequest(_ request: Request, context: GatehouseRequestContext, route: RouteSettings,
                                 identity: CallerIdentity, relay: RelayServices, contentLength: Int?,
                                 sealedUpstreamToken: String?) async throws -> HTTPClientRequest
    {
        let path = request.uri.path
        let rest = path.dropFirst(route.prefix.hasSuffix("/") ? route.prefix.count - 1 : route.prefix.count)
        var url = route.backend + rest
        if let query = request.uri.query { url += "?" + query }
        var outbound = HTTPClientRequest(url: url)
        outbound.method = HTTPMethod(rawValue: request.method.rawValue)

        let policy = RelayHeaderPolicy(route: route, allIdentityHeaders: relay.identityHeaderNames)
        let connectionValues = request.headers[values: .connection]
        let connectionTokens = connectionValues.isEmpty ? [] : RelayHeaderPolicy.connectionTokens(connectionValues)
        for field in request.headers where policy.forwardsRequestHeader(field.name.rawName, connectionTokens: connectionTokens) {
            if sealedUpstreamToken != nil, field.name == .authorization { continue }
            outbound.headers.add(name: field.name.rawName, value: field.value)
        }
        if let sealedUpstreamToken, route.authorization == .passthrough {
            // The token-handler pattern: the backend sees the upstream token it expects.
            outbound.headers.add(name: "Authorization", value: "Bearer " + sealedUpstreamToken)
        }
        for header in route.identityHeaders {
            if let value = identity.value(of: header.source) {
                outbound.headers.add(name: header.name, value: Self.headerSafe(value))
            }
        }
        if route.authorization == .assertion, let signer = relay.signer {
            outbound.headers.add(name: "Authorization", value: "Bearer " + (try await signer.assertion(for: identity, audience: route.backend)))
        }
        relay.addForwardingHeaders(to: &outbound.headers, remoteAddress: context.remoteAddress, requestID: context.requestID)

        if let contentLength, contentLength == 0 {
            return outbound
        }
        if let contentLength, contentLength <= Self.bufferedBodyLimit {
            var request = request
            outbound.body = .bytes(try await request.collectBody(upTo: contentLength))
        } else if contentLength != nil || request.headers[.transferEncoding] != nil {
            let body = RelayRequestBody(base: request.body, limit: route.maximumBodyBytes)
            outbound.body = .stream(body, length: contentLength.map { .known(Int64($0)) } ?? .unknown)
        }
        return outbound
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

    /// Identity values come from another service: no control characters may reach a header.
    static func headerSafe(_ value: String) -> String {
        String(value.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(1024))
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
            guard let buffer = try await base.next() else { return nil }
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
