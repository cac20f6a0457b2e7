/// An RFC 9457 problem that Gatehouse answers outside the OAuth endpoints' JSON errors,
/// and on the pages it shows when an error cannot be sent back to the app safely.
public struct GatehouseProblem: Error, Sendable, Hashable, CustomStringConvertible {
    private enum Base: String, Sendable {
        case badRequest = "bad_request"
        case notFound = "not_found"
        case methodNotAllowed = "method_not_allowed"
        case payloadTooLarge = "payload_too_large"
        case unknownClient = "unknown_client"
        case invalidRedirectURI = "invalid_redirect_uri"
        case unknownState = "unknown_state"
        case storeUnavailable = "store_unavailable"
        case invalidToken = "invalid_token"
        case forbidden
        case identityUnavailable = "identity_unavailable"
        case backendUnavailable = "backend_unavailable"
        case backendTimeout = "backend_timeout"
        case expectationFailed = "expectation_failed"
        case notImplemented = "not_implemented"
        case overCapacity = "over_capacity"
        case rateLimited = "rate_limited"
        case shuttingDown = "shutting_down"
    }

    private let base: Base
    public let status: Int
    public let title: String
    public let detail: String

    private init(_ base: Base, status: Int, title: String, detail: String) {
        self.base = base
        self.status = status
        self.title = title
        self.detail = detail
    }

    /// Gatehouse's own error code, the last segment of the problem `type`.
    public var code: String { base.rawValue }
    public var description: String { "\(code): \(detail)" }

    public static func badRequest(_ detail: String) -> Self {
        .init(.badRequest, status: 400, title: "Bad request", detail: detail)
    }
    public static func notFound(_ detail: String = "There is nothing at this address.") -> Self {
        .init(.notFound, status: 404, title: "Not found", detail: detail)
    }
    public static func methodNotAllowed(_ detail: String = "This address does not take that method.") -> Self {
        .init(.methodNotAllowed, status: 405, title: "Method not allowed", detail: detail)
    }
    public static func payloadTooLarge(limit: Int?) -> Self {
        .init(.payloadTooLarge, status: 413, title: "Payload too large",
              detail: limit.map { "The request body is larger than \($0) bytes." } ?? "The request is larger than Gatehouse accepts.")
    }
    public static func unknownClient(_ detail: String) -> Self {
        .init(.unknownClient, status: 400, title: "Unknown app", detail: detail)
    }
    public static func invalidRedirectURI(_ detail: String) -> Self {
        .init(.invalidRedirectURI, status: 400, title: "Redirect URI not registered", detail: detail)
    }
    public static func unknownState(_ detail: String) -> Self {
        .init(.unknownState, status: 400, title: "Sign-in not recognised", detail: detail)
    }
    /// The access token is missing, unknown, expired or inactive: sign in again (RFC 6750 §3.1).
    public static func invalidToken(_ detail: String) -> Self {
        .init(.invalidToken, status: 401, title: "Sign-in required", detail: detail)
    }
    /// The caller is known but the route's rule says no; `detail` names the rule.
    public static func forbidden(_ detail: String) -> Self {
        .init(.forbidden, status: 403, title: "Forbidden", detail: detail)
    }
    public static func identityUnavailable() -> Self {
        .init(.identityUnavailable, status: 503, title: "Service unavailable",
              detail: "Gatehouse cannot check the access token right now. Nobody is signed out; please try again shortly.")
    }
    public static func backendUnavailable() -> Self {
        .init(.backendUnavailable, status: 502, title: "Bad gateway", detail: "The service behind this route cannot be reached.")
    }
    public static func backendTimeout() -> Self {
        .init(.backendTimeout, status: 504, title: "Gateway timeout", detail: "The service behind this route did not answer in time.")
    }
    /// An `Expect` other than `100-continue` (RFC 9110 §10.1.1).
    public static func expectationFailed() -> Self {
        .init(.expectationFailed, status: 417, title: "Expectation failed", detail: "Gatehouse understands no expectation but 100-continue.")
    }
    /// A transfer coding Gatehouse does not implement (RFC 9112 §6.1).
    public static func notImplemented(_ detail: String) -> Self {
        .init(.notImplemented, status: 501, title: "Not implemented", detail: detail)
    }
    /// Every connection Gatehouse allows is in use; try again shortly.
    public static func overCapacity() -> Self {
        .init(.overCapacity, status: 503, title: "Service unavailable", detail: "Gatehouse is at its connection limit. Please try again shortly.")
    }
    /// A rate limit said no (`rate_limits`); the answer carries `Retry-After`.
    public static func rateLimited(retryAfter: Int) -> Self {
        .init(.rateLimited, status: 429, title: "Too Many Requests", detail: "Too many requests; retry after \(retryAfter) s.")
    }
    /// SIGTERM was received: this instance is draining (`/readyz`).
    public static func shuttingDown() -> Self {
        .init(.shuttingDown, status: 503, title: "Service unavailable", detail: "This instance is shutting down.")
    }
    public static func storeUnavailable() -> Self {
        .init(.storeUnavailable, status: 503, title: "Service unavailable",
              detail: "Gatehouse cannot reach its session store right now. Please try again in a moment.")
    }
}
