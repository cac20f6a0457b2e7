public import GatehouseCore

/// Gatehouse as a confidential client of one upstream authorization server.
///
/// Every failure is thrown as the `OAuthError` the app should see: an unreachable upstream
/// is `temporarily_unavailable` (503), a slow one 504, an unreadable answer `server_error`
/// (502); only errors the app can act on (`invalid_grant`, `invalid_scope`) pass through.
public protocol UpstreamClient: Sendable {
    var settings: UpstreamSettings { get }

    /// Where to send the browser: the upstream's authorization endpoint with Gatehouse's own
    /// `state` (and its own PKCE challenge when `codeChallenge` is given).
    func authorizationURL(state: String, redirectURI: String, scopes: [String], codeChallenge: String?) -> String

    /// Swaps an upstream authorization code for tokens, adding Gatehouse's client credentials.
    func exchangeCode(_ code: String, redirectURI: String, codeVerifier: String?) async throws(OAuthError) -> UpstreamTokenResponse

    /// Swaps an upstream refresh token, adding Gatehouse's client credentials.
    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse

    /// Revokes a token at the upstream's RFC 7009 endpoint, when it has one; best effort.
    func revoke(_ token: String, hint: String) async
}
