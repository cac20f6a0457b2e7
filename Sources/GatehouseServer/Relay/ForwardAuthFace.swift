import Foundation
import GatehouseCore
import GatehouseRelay
import Hummingbird
import HTTPTypes
import Logging
import NIOCore

/// The decision endpoint for the team's own ingress (`forward_auth:`, docs/relay.md "Behind your
/// ingress"): the relay's one admission (`RelayFace.decide`) run on the original request the
/// ingress describes. Allowed: 200 with exactly what the relay would have told the backend.
/// Refused: the relay's very answer. It never reads a body and never contacts a backend.
struct ForwardAuthFace {
    let relay: RelayFace
    let settings: ForwardAuthSettings
    /// The clock an allow's lifetime is measured by.
    let now: @Sendable () -> Date

    /// Envoy's HTTP `ext_authz` service: `path_prefix` is this, the original path follows it.
    static let envoyPrefix = ForwardAuthSettings.path + "/envoy"
    /// nginx's `error_page` hands a refusal back here (`X-Gatehouse-Refusal`).
    static let refusalPath = ForwardAuthSettings.path + "/refusal"
    static let refusalHeader = HTTPField.Name("X-Gatehouse-Refusal")!
    static let accelExpires = HTTPField.Name("X-Accel-Expires")!
    /// What a refusal handed back may carry besides its body: the relay's refusals set no other.
    static let refusalFields: Set<String> = ["content-type", "cache-control", "www-authenticate", "retry-after", "dpop-nonce", "allow",
                                             "content-security-policy", "connection"]

    /// Whether `path` is the endpoint's (then it never reaches a route or the router).
    static func owns(_ path: String) -> Bool {
        path == ForwardAuthSettings.path || path.hasPrefix(ForwardAuthSettings.path + "/")
    }

    /// What a request to the endpoint is, by its path (both paths that answer read it here).
    enum Question: Equatable {
        /// `/forward-auth`: the original request in the ingress's headers.
        case ingress
        /// `/forward-auth/envoy…`: Envoy's, the original target being what follows the prefix in
        /// the raw request target.
        case envoy(target: String)
        /// `/forward-auth/refusal`: nginx handing a refusal back.
        case refusal
    }

    /// The question `path` (the request's path, without query) asks, or `nil` for any other path
    /// under the endpoint (a 404). `rawTarget`: the request target as sent.
    static func question(path: String, rawTarget: String) -> Question? {
        if path == ForwardAuthSettings.path { return .ingress }
        if path == refusalPath { return .refusal }
        if path == envoyPrefix || path.hasPrefix(envoyPrefix + "/") { return .envoy(target: String(rawTarget.dropFirst(envoyPrefix.count))) }
        return nil
    }

    func serve(_ request: Request, context: some GatehouseRequestContextProtocol) async -> Response {
        let logger = relay.logger
        guard settings.trusts(context.remoteAddress) else {
            // Nothing it sent is read: anyone could write X-Original-URI.
            logger.notice("forward-auth request from an untrusted address refused")
            return .problem(.forbidden("Decisions are given only to the ingress: forward_auth.trusted_proxies does not list this address."),
                            for: request)
        }
        let envoyTarget: String?
        switch Self.question(path: request.uri.path, rawTarget: request.head.path ?? "") {
        case .refusal: return handingBack(request)
        case .envoy(let target): envoyTarget = target
        case .ingress: envoyTarget = nil
        case nil: return .problem(.notFound(), for: request)
        }
        let headers = request.headers
        let authority = request.head.authority
        let fields: ForwardedRequest.Fields = { name in
            // HTTP types keep `Host` as the request's authority, not among its fields.
            if name == "host" { return authority.map { [$0] } ?? [] }
            return HTTPField.Name(name).map { headers[values: $0] } ?? []
        }
        // nginx cannot hand a refusal's body on: when the question is nginx's, it carries itself.
        let asksWhole = envoyTarget == nil && (!fields("x-original-uri").isEmpty || !fields("x-original-url").isEmpty)
        if let problem = ForwardedRequest.screen(authority: authority, publicAuthority: relay.services.forwarding.host,
                                                 publicScheme: relay.services.forwarding.proto, names: headers.lazy.map(\.name.rawName)) {
            let status: GatehouseProblem = problem == .public ? .forbidden(problem.detail) : .badRequest(problem.detail)
            return await refused(.problem(status, for: request), handBack: asksWhole)
        }
        let original: ForwardedRequest
        switch ForwardedRequest.read(fields, ownMethod: request.method.rawValue, envoyTarget: envoyTarget) {
        case .success(let read): original = read
        case .failure(let error): return await refused(.problem(.badRequest(error.detail), for: request), handBack: asksWhole)
        }
        guard let method = HTTPRequest.Method(original.method) else {
            return await refused(.problem(.badRequest("The original method is not an HTTP method."), for: request), handBack: asksWhole)
        }
        // The app's request as the relay would have seen it: its method and target, its headers
        // (the ingress passes the client's), without the subrequest's own framing.
        var fieldsOut = HTTPFields()
        for field in headers where !Self.framing.contains(field.name) { fieldsOut.append(field) }
        let appRequest = Request(head: HTTPRequest(method: method, scheme: original.scheme, authority: original.host, path: original.target,
                                                   headerFields: fieldsOut),
                                 body: RequestBody(buffer: ByteBuffer()))
        guard let route = relay.configuration.route(for: appRequest.uri.path) else {
            // What the relay's face answers for a path outside every route (the router's 404).
            return await refused(.problem(.notFound(), for: appRequest), handBack: asksWhole)
        }
        let trusted = settings.trustedProxies + relay.configuration.operations.rateLimits.trustedProxies
        let peer = context.remoteAddress
        let clientAddress = {
            let forwardedFor = headers[values: RateLimiters.forwardedFor]
            let realIP = headers[values: .xRealIP]
            let address = forwardedFor.isEmpty && realIP.count == 1 && AddressRange(realIP[0]) != nil
                ? realIP[0]
                : ClientAddress.resolve(peer: peer, forwardedFor: forwardedFor.isEmpty ? nil : forwardedFor.joined(separator: ","),
                                        forwarded: nil, trusted: trusted)
            return address.map(ClientAddress.bucketKey)
        }
        let htu = original.scheme + "://" + (original.host ?? "") + appRequest.uri.path
        switch await relay.decide(appRequest, route: route, htu: htu, clientAddress: clientAddress) {
        case .refused(let response):
            return await refused(response, handBack: asksWhole)
        case .admitted(let admitted):
            do {
                return try await allowed(admitted, route: route, appRequest: appRequest)
            } catch {
                logger.warning("forward-auth assertion not signed", metadata: ["route": .string(route.prefix)])
                return await refused(.problem(.backendUnavailable(), for: appRequest), handBack: asksWhole)
            }
        }
    }

    /// The subrequest's own framing: never the app's (a decision reads no body).
    private static let framing: Set<HTTPField.Name> = [.contentLength, .transferEncoding, .expect, .connection]

    /// 200: the route's identity headers, the `Authorization` the backend should get, and how long
    /// the ingress may keep the answer (`ForwardAuthAllow`, which the fast path answers with too).
    private func allowed(_ admitted: RelayFace.Admitted, route: RouteSettings, appRequest: Request) async throws -> Response {
        let scheme = admitted.admission.scheme
        let authorization = ForwardAuthAllow.authorization(route: route, replaced: try await relay.replacedAuthorization(admitted, route: route),
                                                           scheme: scheme, appHeader: appRequest.headers[values: .authorization].first)
        let seconds = ForwardAuthAllow.cacheSeconds(scheme: scheme, maxAge: settings.maxAge,
                                                    cacheTTL: relay.configuration.upstreams[route.upstream]?.identity?.cacheTTL,
                                                    expiresAt: admitted.identity.expiresAt, now: now())
        var headers = HTTPFields()
        for (name, value) in ForwardAuthAllow.headers(route: route, identity: admitted.identity, authorization: authorization, cacheSeconds: seconds) {
            if let name = HTTPField.Name(name) { headers.append(HTTPField(name: name, value: value)) }
        }
        return Response(status: .ok, headers: headers, body: ResponseBody())
    }

    /// A refusal as the relay answers it, never cacheable; for nginx (which passes only 401 and
    /// 403, without a body) it also carries itself whole in `X-Gatehouse-Refusal`.
    private func refused(_ response: Response, handBack: Bool) async -> Response {
        var response = response
        response.headers[.cacheControl] = "no-store"
        response.headers[Self.accelExpires] = "0"
        guard handBack else { return response }
        let collector = Collector()
        do { try await response.body.write(collector) } catch { return response }
        response.body = ResponseBody(byteBuffer: ByteBuffer(bytes: collector.bytes))
        let carried = CarriedRefusal(status: response.status.code,
                                     headers: response.headers.filter { Self.refusalFields.contains($0.name.canonicalName) }
                                         .map { [$0.name.rawName, $0.value] },
                                     body: String(decoding: collector.bytes, as: UTF8.self))
        let encoded = Base64URL.encode(JSONCoding.encode(carried))
        // nginx reads an answer's head into proxy_buffer_size (4 KiB by default): a larger one is left out.
        if encoded.utf8.count <= 3072 { response.headers[Self.refusalHeader] = encoded }
        return response
    }

    /// `GET /forward-auth/refusal`: the refusal nginx's `error_page` hands back, answered whole.
    private func handingBack(_ request: Request) -> Response {
        guard let value = request.headers[values: Self.refusalHeader].first, request.headers[values: Self.refusalHeader].count == 1,
              let data = Base64URL.decode(value), let carried = try? JSONDecoder().decode(CarriedRefusal.self, from: data),
              (400...599).contains(carried.status)
        else {
            return .problem(.badRequest("X-Gatehouse-Refusal is missing or is not a refusal of this Gatehouse."), for: request)
        }
        var headers = HTTPFields()
        for pair in carried.headers where pair.count == 2 {
            guard Self.refusalFields.contains(pair[0].lowercased()), let name = HTTPField.Name(pair[0]) else { continue }
            headers.append(HTTPField(name: name, value: RelayHeaderPolicy.headerSafe(pair[1])))
        }
        headers[.cacheControl] = "no-store"
        // Only what Gatehouse's refusals are: a problem, or its page for a browser, never run.
        let html = headers[.contentType] == "text/html; charset=utf-8"
        headers[.contentType] = html ? "text/html; charset=utf-8" : "application/problem+json"
        headers[.contentSecurityPolicy] = "default-src 'none'; style-src 'unsafe-inline'"
        headers[HTTPField.Name("X-Content-Type-Options")!] = "nosniff"
        return Response(status: HTTPResponse.Status(code: carried.status), headers: headers,
                        body: ResponseBody(byteBuffer: ByteBuffer(string: carried.body)))
    }

    /// Collects a refusal's body (the relay's refusals are built whole, in memory).
    private final class Collector: ResponseBodyWriter, @unchecked Sendable {
        var bytes: [UInt8] = []
        func write(_ buffer: ByteBuffer) async throws { bytes += buffer.readableBytesView }
        func finish(_ trailingHeaders: HTTPFields?) async throws {}
    }
}

/// A refusal carried through nginx: status, the headers of `refusalFields`, the body.
struct CarriedRefusal: Codable {
    let status: Int
    let headers: [[String]]
    let body: String
}

extension HTTPField.Name {
    static let xRealIP = HTTPField.Name("X-Real-IP")!
}
