/// The endpoints Gatehouse calls on an upstream, as `gatehouse_upstream_requests_total{endpoint}`
/// labels them and the `upstream <endpoint>` client span names them.
public enum UpstreamEndpoint: String, Sendable, CaseIterable {
    /// The token endpoint, swapping an authorization code (RFC 6749 §4.1.3).
    case token
    /// The token endpoint, swapping a refresh token (RFC 6749 §6).
    case refresh
    /// RFC 7009 revocation.
    case revoke
    /// An identity service asked who holds an access token (the relay).
    case identity
    /// A JSON Web Key Set (RFC 7517 §5).
    case jwks
    /// OpenID Connect userinfo at sign-in.
    case userinfo
    /// OpenID Connect Discovery.
    case discovery
    /// A central sign-in provider's signed server-to-server API.
    case s2s
    /// A pushed authorization request (RFC 9126).
    case par

    /// `upstream <endpoint>`: a constant, so a call formats nothing when tracing is off.
    public var spanName: String {
        switch self {
        case .token: "upstream token"
        case .refresh: "upstream refresh"
        case .revoke: "upstream revoke"
        case .identity: "upstream identity"
        case .jwks: "upstream jwks"
        case .userinfo: "upstream userinfo"
        case .discovery: "upstream discovery"
        case .s2s: "upstream s2s"
        case .par: "upstream par"
        }
    }

    /// The token endpoint, where a 400 may carry `invalid_grant` and a 429 starts a backoff.
    var isTokenEndpoint: Bool { self == .token || self == .refresh }
}
