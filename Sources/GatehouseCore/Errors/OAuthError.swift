/// An OAuth 2.0 error as the app sees it (RFC 6749 §4.1.2.1 and §5.2).
///
/// Built only through the static members below, so every error Gatehouse can answer is listed
/// here and in docs/app.md's error catalog. `description` is shown to the app: it never holds a
/// token, code, verifier or secret.
public struct OAuthError: Error, Sendable, Hashable, CustomStringConvertible {
    private enum Base: String, Sendable {
        case invalidRequest = "invalid_request"
        case invalidClient = "invalid_client"
        case invalidGrant = "invalid_grant"
        case unauthorizedClient = "unauthorized_client"
        case unsupportedGrantType = "unsupported_grant_type"
        case unsupportedResponseType = "unsupported_response_type"
        case invalidScope = "invalid_scope"
        case accessDenied = "access_denied"
        case serverError = "server_error"
        case temporarilyUnavailable = "temporarily_unavailable"
        case invalidDPoPProof = "invalid_dpop_proof"
        case useDPoPNonce = "use_dpop_nonce"
        case invalidClientMetadata = "invalid_client_metadata"
        case invalidRedirectURI = "invalid_redirect_uri"
        case invalidAttestation = "invalid_attestation"
    }

    private let base: Base
    /// The `error_description`: human readable, safe to show.
    public let detail: String
    /// The HTTP status the token endpoint answers with.
    public let status: Int
    /// Seconds the app should wait before trying again (`Retry-After`), for 503 answers.
    public let retryAfter: Int?
    /// For a failed upstream exchange: whether the request may have reached the upstream.
    public private(set) var delivery: UpstreamDelivery = .notUpstream
    /// For a failed upstream exchange: whether it took a whole timeout (to connect, or for the
    /// answer). Such an attempt is not repeated for the same request: the app would wait as long
    /// again, most likely for the same 503.
    public private(set) var timedOut = false
    /// The server nonce the app must put in its next DPoP proof (`DPoP-Nonce`, RFC 9449 §8).
    public private(set) var dpopNonce: String?

    private init(_ base: Base, _ detail: String, status: Int, retryAfter: Int? = nil) {
        self.base = base
        self.detail = detail
        self.status = status
        self.retryAfter = retryAfter
    }

    /// The same error, recording whether the failed upstream request may have been acted on,
    /// and whether it waited out a timeout (`timedOut`).
    public func delivered(_ delivery: UpstreamDelivery, timedOut: Bool? = nil) -> Self {
        var copy = self
        copy.delivery = delivery
        if let timedOut { copy.timedOut = timedOut }
        return copy
    }

    /// The `error` code of RFC 6749.
    public var code: String { base.rawValue }
    public var description: String { "\(code): \(detail)" }

    public static func invalidRequest(_ detail: String) -> Self { .init(.invalidRequest, detail, status: 400) }
    public static func invalidClient(_ detail: String) -> Self { .init(.invalidClient, detail, status: 401) }
    public static func invalidGrant(_ detail: String) -> Self { .init(.invalidGrant, detail, status: 400) }
    public static func unsupportedGrantType(_ detail: String) -> Self { .init(.unsupportedGrantType, detail, status: 400) }
    public static func unsupportedResponseType(_ detail: String) -> Self { .init(.unsupportedResponseType, detail, status: 400) }
    public static func invalidScope(_ detail: String) -> Self { .init(.invalidScope, detail, status: 400) }
    public static func accessDenied(_ detail: String) -> Self { .init(.accessDenied, detail, status: 403) }
    /// The client may not use this grant: an uncertified instance of an app that requires attestation.
    public static func unauthorizedClient(_ detail: String) -> Self { .init(.unauthorizedClient, detail, status: 400) }
    /// A missing or wrong DPoP proof at the token endpoint (RFC 9449 §5).
    public static func invalidDPoPProof(_ detail: String) -> Self { .init(.invalidDPoPProof, detail, status: 400) }
    /// The proof lacks the server's current nonce; `nonce` goes in the `DPoP-Nonce` header (RFC 9449 §8).
    public static func useDPoPNonce(nonce: String) -> Self {
        var error = Self(.useDPoPNonce, "the DPoP proof must carry the nonce of the DPoP-Nonce header", status: 400)
        error.dpopNonce = nonce
        return error
    }
    /// Registration metadata Gatehouse will not accept (RFC 7591 §3.2.2).
    public static func invalidClientMetadata(_ detail: String) -> Self { .init(.invalidClientMetadata, detail, status: 400) }
    /// A registered redirect URI the app does not own (RFC 7591 §3.2.2).
    public static func invalidRedirectURI(_ detail: String) -> Self { .init(.invalidRedirectURI, detail, status: 400) }
    /// An App Attest or Play Integrity statement Gatehouse refused.
    public static func invalidAttestation(_ detail: String) -> Self { .init(.invalidAttestation, detail, status: 400) }
    /// The upstream answered something Gatehouse cannot use: 502.
    public static func badUpstream(_ detail: String) -> Self { .init(.serverError, detail, status: 502) }
    /// Gatehouse itself failed (its store, its configuration): 500 is never used, 503 is.
    public static func serverError(_ detail: String) -> Self { .init(.serverError, detail, status: 503, retryAfter: 5) }
    /// The upstream could not be reached: 503 with `Retry-After`.
    public static func upstreamUnavailable(_ detail: String, retryAfter: Int = 5) -> Self {
        .init(.temporarilyUnavailable, detail, status: 503, retryAfter: retryAfter)
    }
    /// The upstream did not answer in time: 504.
    /// A `rate_limits` bucket of `/oauth/*` is empty: 429 with `Retry-After`.
    public static func rateLimited(retryAfter: Int) -> Self {
        .init(.temporarilyUnavailable, "Too many requests; retry after \(retryAfter) s.", status: 429, retryAfter: retryAfter)
    }
    public static func upstreamTimeout(_ detail: String) -> Self {
        var error = Self(.temporarilyUnavailable, detail, status: 504)
        error.timedOut = true
        return error
    }

    /// Rebuilds an error an upstream sent, for the codes an app can act on; `nil` for the others.
    ///
    /// `invalid_grant` and `invalid_scope` are the app's business (its grant is dead, its scope
    /// too wide). `invalid_client` and the rest describe Gatehouse's own registration upstream,
    /// which the app can do nothing about, so the caller maps them to `badUpstream`.
    public static func relayable(fromUpstream code: String, detail: String?) -> Self? {
        switch code {
        case Base.invalidGrant.rawValue: .invalidGrant(detail ?? "the grant is invalid, expired or revoked")
        case Base.invalidScope.rawValue: .invalidScope(detail ?? "the requested scope is not allowed")
        case Base.accessDenied.rawValue: .accessDenied(detail ?? "the user or the authorization server denied the request")
        default: nil
        }
    }

    /// Errors an authorization server may send on a redirect (RFC 6749 §4.1.2.1); others become `server_error`.
    public static func fromAuthorizationResponse(code: String, detail: String?) -> Self {
        let known: [Base] = [.invalidRequest, .unauthorizedClient, .accessDenied, .unsupportedResponseType,
                             .invalidScope, .serverError, .temporarilyUnavailable]
        let base = known.first { $0.rawValue == code } ?? .serverError
        let safeDetail = detail.map { String($0.prefix(300)) } ?? "the authorization server answered \(base.rawValue)"
        return .init(base, safeDetail, status: 400)
    }
}

/// Whether a failed upstream request may have been acted on: what decides if a single-use
/// refresh token may be sent again.
public enum UpstreamDelivery: Sendable, Hashable {
    /// Not a transport failure toward an upstream (an OAuth error, a refusal by Gatehouse).
    case notUpstream
    /// Provably not acted on: the connection was never made, or the upstream answered 429 or
    /// 503 (it did not process the request).
    case unspent
    /// Unknown: a timeout or a reset after the request was sent, or a 500, 502 or 504.
    case unknown
}
