public import AsyncHTTPClient
public import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import NIOHTTP1

/// What went wrong in an S2S call, in terms both of Gatehouse's faces can answer.
public enum CentralFailure: Error, Sendable, Equatable {
    /// The provider does not know the code (unknown, expired, used, or another app's): its 404.
    case codeNotFound
    /// The provider's own limit (5 e-mails per hour per address): its 429.
    case rateLimited(retryAfter: Int)
    /// The provider could not be reached (503, 504) or answered something unusable (502).
    case upstream(OAuthError)

    /// The same failure as an OAuth error, for `/oauth/*`.
    public var oauthError: OAuthError {
        switch self {
        case .codeNotFound: .invalidGrant("the central sign-in provider does not know the code (unknown, expired or already used)")
        case .rateLimited(let seconds): .upstreamUnavailable("the central sign-in provider asks to wait", retryAfter: seconds)
        case .upstream(let error): error
        }
    }
}

/// Gatehouse's S2S calls to a central sign-in provider (`{api_base}/v1/auth/…`), each signed
/// with the app's key (`CentralRequestSigner`) and bounded by the upstream's `timeout`.
///
/// The signed path is the path of the URL Gatehouse posts to, `api_base`'s own path included:
/// the published client signs its contract path `/api/v1/auth/…` and posts to `{baseUrl}` + that
/// path, and the provider checks the signature against the route it registered, the same
/// `/api/v1/auth/…`. With `api_base: https://www.broccoliapps.com/api` both are `/api/v1/auth/verify`.
public struct CentralClient: Sendable {
    let http: UpstreamHTTP
    let central: CentralSettings
    let now: @Sendable () -> Date

    public init(settings: UpstreamSettings, central: CentralSettings, httpClient: HTTPClient, logger: Logger,
                now: @escaping @Sendable () -> Date = Date.init) {
        self.http = UpstreamHTTP(settings: settings, httpClient: httpClient, logger: logger)
        self.central = central
        self.now = now
    }

    var appID: String { http.settings.clientID }

    /// `POST /v1/auth/verify {app, code}`: the user behind a one-minute code, which it spends.
    ///
    /// An unknown, expired, used or another app's code is verify.ts's `HttpError(404, "Auth code
    /// not found")`, which the provider writes as its API error (`CentralProviderError`): that and
    /// only that is `.codeNotFound`. A 404 in any other shape is a route the provider does not have.
    public func verify(code: String) async throws(CentralFailure) -> CentralUser {
        let answer = try await call("/v1/auth/verify", body: Self.object([("app", appID), ("code", code)]), purpose: "code verification")
        if answer.status == 404, CentralProviderError(answer)?.message == "Auth code not found" { throw .codeNotFound }
        return try user(in: answer, route: "/v1/auth/verify")
    }

    /// `POST /v1/auth/email {app, email, platform?}`: the provider e-mails a magic link.
    public func sendMagicLink(email: String, platform: String?) async throws(CentralFailure) {
        var members = [("app", appID), ("email", email)]
        if let platform { members.append(("platform", platform)) }
        let answer = try await call("/v1/auth/email", body: Self.object(members), purpose: "magic link")
        guard answer.status == 200 else { throw refusal(answer, route: "/v1/auth/email") }
        let object = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any]
        guard object?["success"] as? Bool == true else {
            throw .upstream(.badUpstream("the central sign-in provider did not confirm the e-mail"))
        }
    }

    /// `POST /v1/auth/verify-native {app, email, name, provider: "apple"}`: the central user for
    /// a person Gatehouse has checked (Sign in with Apple on iOS).
    public func verifyNative(email: String, name: String) async throws(CentralFailure) -> CentralUser {
        let body = Self.object([("app", appID), ("email", email), ("name", name), ("provider", "apple")])
        return try user(in: try await call("/v1/auth/verify-native", body: body, purpose: "native verification"), route: "/v1/auth/verify-native")
    }

    private func user(in answer: (status: Int, headers: HTTPHeaders, body: Data), route: String) throws(CentralFailure) -> CentralUser {
        guard answer.status == 200 else { throw refusal(answer, route: route) }
        struct Answer: Decodable { let user: CentralUser }
        guard let user = try? JSONDecoder().decode(Answer.self, from: answer.body).user, !user.userId.isEmpty else {
            throw .upstream(.badUpstream("the central sign-in provider's answer has no user {userId, email, name, provider}"))
        }
        return user
    }

    /// What the app is told of an answer other than the call's success, and what the operator is:
    /// every refusal of a well-signed call is Gatehouse's or the deployment's to mend (its key, its
    /// clock, `api_base`), so the app gets a 502 and the log the provider's words.
    private func refusal(_ answer: (status: Int, headers: HTTPHeaders, body: Data), route: String) -> CentralFailure {
        let provider = CentralProviderError(answer)
        var metadata: Logger.Metadata = ["upstream": .string(http.settings.name), "route": .string(route),
                                         "status": .stringConvertible(answer.status)]
        if let provider {
            metadata["message"] = .string(provider.message)
            if !provider.details.isEmpty { metadata["details"] = .string(provider.details.joined(separator: "; ")) }
        }
        switch answer.status {
        case 429:
            let seconds = answer.headers.first(name: "Retry-After").flatMap(Int.init).map { max(1, min($0, 3600)) } ?? 60
            return .rateLimited(retryAfter: seconds)
        case 401:
            // The provider refused Gatehouse's signature: a key or clock to fix here, not the app's doing.
            http.logger.error("the central sign-in provider refused Gatehouse's S2S signature; check s2s_private_key_file and the clock",
                              metadata: metadata)
            return .upstream(.badUpstream("the central sign-in provider refused Gatehouse's request"))
        case 403:
            // verify.ts before the S2S signature: the code's RSA envelope did not open with the app's public key.
            http.logger.error("the central sign-in provider could not verify Gatehouse's request; check s2s_private_key_file and the app's registered public key",
                              metadata: metadata)
            return .upstream(.badUpstream("the central sign-in provider refused Gatehouse's request"))
        case 400 where provider != nil:
            http.logger.error("the central sign-in provider refused the body of Gatehouse's request", metadata: metadata)
            return .upstream(.badUpstream("the central sign-in provider refused Gatehouse's request"))
        case 404 where provider != nil:
            // The route is there (the provider's own JSON answered), so api_base is right.
            http.logger.error("the central sign-in provider refused Gatehouse's request", metadata: metadata)
            return .upstream(.badUpstream("the central sign-in provider refused Gatehouse's request"))
        case 404:
            // Not the provider's JSON: no route answered (Hono's text "404 Not Found", or a host that is not the API).
            http.logger.error("the central sign-in provider has no such route; check api_base (the provider's S2S routes are under /api)",
                              metadata: metadata.merging(["api_base": .string(central.apiBase)]) { $1 })
            return .upstream(.badUpstream("the central sign-in provider answered HTTP 404"))
        case 503:
            return .upstream(.upstreamUnavailable("the central sign-in provider is temporarily unavailable"))
        default:
            return .upstream(.badUpstream("the central sign-in provider answered HTTP \(answer.status)"))
        }
    }

    /// The URL of one S2S call and the path its signature covers: the URL's path component as it
    /// goes on the request line, `api_base`'s path included (`api_base` holds no query, fragment or
    /// percent-escape, so the path is sent as written).
    public static func target(apiBase: String, route: String) -> (url: String, signedPath: String) {
        let url = apiBase + route
        let afterScheme = url.range(of: "://").map { url[$0.upperBound...] } ?? url[...]
        let path = afterScheme.firstIndex(of: "/").map { afterScheme[$0...] } ?? "/"
        return (url, String(path.prefix { $0 != "?" && $0 != "#" }))
    }

    /// One signed POST; the timestamp is taken just before sending (the verifier allows 15 s).
    private func call(_ route: String, body: String, purpose: String) async throws(CentralFailure) -> (status: Int, headers: HTTPHeaders, body: Data) {
        let target = Self.target(apiBase: central.apiBase, route: route)
        var request = HTTPClientRequest(url: target.url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "Accept", value: "application/json")
        do {
            for (name, value) in try central.s2sKey.headers(appID: appID, path: target.signedPath, body: body, timestamp: now()) {
                request.headers.add(name: name, value: value)
            }
        } catch {
            throw .upstream(.serverError("Gatehouse could not sign its request to the central sign-in provider"))
        }
        request.body = .bytes(ByteBuffer(string: body))
        do throws(OAuthError) {
            return try await http.sendWithHeaders(request, endpoint: .s2s, purpose: purpose)
        } catch {
            throw .upstream(error)
        }
    }

    /// A JSON object with its members in the given order, as `JSON.stringify` of an object literal writes it.
    static func object(_ members: [(String, String)]) -> String {
        "{" + members.map { CentralRequestSigner.javaScriptString($0.0) + ":" + CentralRequestSigner.javaScriptString($0.1) }
            .joined(separator: ",") + "}"
    }
}

/// An error the provider wrote itself: api-router.ts's `ApiErrorResponse`, the JSON object
/// `{status, message, details?}` with `status` the answer's own and no other member. A path the
/// provider has no route for is answered by Hono's default (text `404 Not Found`) and a host
/// that is not the provider's API by whatever it serves: neither has this shape, so it tells the
/// provider's "Auth code not found" from a wrong `api_base` without guessing from the status.
struct CentralProviderError: Equatable {
    let status: Int
    let message: String
    let details: [String]

    init?(_ answer: (status: Int, headers: HTTPHeaders, body: Data)) {
        guard MediaType.matches(answer.headers.first(name: "Content-Type"), "application/json"),
              let object = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any],
              Set(object.keys).isSubset(of: ["status", "message", "details"]),
              let status = object["status"] as? NSNumber, !(object["status"] is Bool), status.intValue == answer.status,
              status.doubleValue == Double(answer.status),
              let message = object["message"] as? String, !message.isEmpty else { return nil }
        let details = object["details"] as? [String]
        guard object["details"] == nil || details != nil else { return nil }
        self.status = answer.status
        self.message = Self.loggable(message)
        self.details = (details ?? []).prefix(5).map(Self.loggable)
    }

    /// The provider's words as the log takes them: printable, at most 200 characters.
    private static func loggable(_ text: String) -> String {
        String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(200).map(Character.init))
    }
}
