public import Foundation
public import GatehouseCore

/// One kind of upstream's whole dialogue with its authorization server: what goes in the
/// authorize URL, how the browser's answer becomes tokens and a verified identity, refresh,
/// revocation and the end of the browser session. The routes ask the profile; they decide
/// nothing about PKCE, nonces or token formats themselves.
///
/// Every failure is thrown as the `OAuthError` the app should see: an unreachable upstream
/// is `temporarily_unavailable` (503), a slow one 504, an unreadable or unverifiable answer
/// `server_error` (502); only errors the app can act on (`invalid_grant`, `invalid_scope`)
/// pass through.
public protocol UpstreamProfile: Sendable {
    var settings: UpstreamSettings { get }

    /// Where to send the browser, and what the transaction must remember until it is back.
    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun

    /// The upstream's code (from the callback, or posted by the app in relay mode) swapped for
    /// tokens with Gatehouse's credentials, and everything the sign-in proves checked.
    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant

    /// Whether this upstream issues refresh tokens Gatehouse may use (some do not: their sessions live on Gatehouse's own lifetimes).
    var canRefresh: Bool { get }

    /// Swaps an upstream refresh token, adding Gatehouse's client credentials.
    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse

    /// Revokes a token at the upstream's RFC 7009 endpoint, when it has one; best effort.
    func revoke(_ token: String, hint: String) async

    /// Where to send the browser to end the person's session at the upstream (OpenID Connect
    /// RP-Initiated Logout), or `nil` when the upstream has no such endpoint.
    func endSessionURL(idToken: String, state: String, postLogoutRedirectURI: String) async throws(OAuthError) -> String?

    /// Checks an ID token this upstream issued, presented back by an app as `id_token_hint`:
    /// signature, issuer and audience (its expiry does not matter for a logout). Returns its `sub`.
    func verifyIDTokenHint(_ idToken: String) async throws(OAuthError) -> String

    /// How the browser brings Gatehouse's state back from the sign-in page (`.query` by default).
    var signInReturn: SignInReturn { get }

    /// Gatehouse's own tokens for this upstream's apps, when the upstream gives none they may use.
    var minter: (any TokenMinter)? { get }

    /// The endpoints of the kind's own app face, if it has one.
    var appRoutes: [AppRoute] { get }

    /// The steps of an in-app sign-in this upstream offers; `nil`: only the browser (`redirect_to_web`).
    var inAppSignIn: (any InAppSignInSteps)? { get }
}

extension UpstreamProfile {
    public var canRefresh: Bool { true }

    public func endSessionURL(idToken: String, state: String, postLogoutRedirectURI: String) async throws(OAuthError) -> String? { nil }

    public func verifyIDTokenHint(_ idToken: String) async throws(OAuthError) -> String {
        throw .invalidRequest("this upstream issues no ID tokens")
    }

    public var signInReturn: SignInReturn { .query }

    public var minter: (any TokenMinter)? { nil }

    public var appRoutes: [AppRoute] { [] }

    public var inAppSignIn: (any InAppSignInSteps)? { nil }

    /// RFC 9207: an `iss` on the authorization response must be the issuer the sign-in was sent to;
    /// an answer naming another issuer is a mix-up attempt (RFC 9700 §4.4).
    public func checkResponseIssuer(_ issuer: String?, memo: UpstreamMemo) throws(OAuthError) {
        // An upstream configured without an issuer (plain OAuth 2.0) has nothing to compare with.
        guard let expected = memo.issuer else { return }
        guard let issuer else {
            if memo.requiresResponseIssuer == true { throw .badUpstream("the authorization response carries no iss, which its issuer promised") }
            return
        }
        guard expected == issuer else {
            throw .badUpstream("the authorization response names another issuer (iss)")
        }
    }
}

/// What a profile needs to begin a sign-in.
public struct AuthorizationStart: Sendable {
    /// Gatehouse's own `state` toward the upstream (43 characters).
    public var state: String
    /// Where the upstream sends the browser: Gatehouse's callback, or the app (relay mode).
    public var redirectURI: String
    public var scopes: [String]
    public var wiring: UpstreamWiring
    /// The app's S256 challenge; in relay mode it goes upstream when the upstream takes PKCE.
    public var appCodeChallenge: String

    public init(state: String, redirectURI: String, scopes: [String], wiring: UpstreamWiring, appCodeChallenge: String) {
        self.state = state
        self.redirectURI = redirectURI
        self.scopes = scopes
        self.wiring = wiring
        self.appCodeChallenge = appCodeChallenge
    }
}

extension AuthorizationStart {
    /// PKCE toward an upstream that takes it (RFC 7636): in callback mode Gatehouse's own
    /// verifier, remembered in `memo`; in relay mode the upstream sends the browser straight to
    /// the app, so the app's own challenge goes upstream and its verifier follows at the token endpoint.
    func pkceParameters(remembering memo: inout UpstreamMemo) -> [(String, String)] {
        let challenge: String
        switch wiring {
        case .callback:
            let verifier = SecureToken.generate()
            memo.codeVerifier = verifier
            challenge = PKCE.challenge(for: verifier)
        case .relay:
            memo.forwardsAppVerifier = true
            challenge = appCodeChallenge
        }
        return [("code_challenge", challenge), ("code_challenge_method", PKCE.method)]
    }
}

/// The browser's next stop and what the transaction keeps for the profile.
public struct AuthorizationBegun: Sendable {
    public var url: String
    public var memo: UpstreamMemo

    public init(url: String, memo: UpstreamMemo) {
        self.url = url
        self.memo = memo
    }
}

/// A completed sign-in: the upstream's tokens as it sent them, and for OpenID Connect
/// upstreams the verified identity.
public struct UpstreamGrant: Sendable {
    /// `nil` for an upstream that only proves who signed in (its kind mints the app's tokens).
    public var tokens: UpstreamTokenResponse?
    /// The userinfo claims, verified, exactly as the upstream sent them (a JSON object's bytes).
    public var userinfo: Data?
    /// The ID token's `sub`, once validated.
    public var subject: String?

    public init(tokens: UpstreamTokenResponse?, userinfo: Data? = nil, subject: String? = nil) {
        self.tokens = tokens
        self.userinfo = userinfo
        self.subject = subject
    }
}
