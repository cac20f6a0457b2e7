public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import Logging

/// The `oauth2` kind's own settings: a plain OAuth 2.0 server's endpoints.
public struct OAuth2Settings: UpstreamProfileSettings {
    public var authorizationEndpoint: String
    public var tokenEndpoint: String
    /// RFC 7009 revocation endpoint, where Gatehouse revokes refresh tokens when a session ends.
    public var revocationEndpoint: String?
    /// Whether the upstream understands PKCE; Gatehouse then uses PKCE toward it too.
    public var pkce: Bool
    /// Whether, and in which dialect, the upstream takes the resource-owner password grant
    /// (RFC 6749 §4.3) from Gatehouse: in-app sign-in then relays the user's password to it.
    public var passwordGrant: OAuth2PasswordGrant = .off
    /// Where Auth0's second factor is challenged (`/mfa/challenge` beside `/oauth/token` unless configured).
    public var mfaChallengeEndpoint: String?
    /// RFC 9126: where authorization requests are pushed (`pushed_authorization_requests: auto`
    /// pushes them whenever this is configured; `never` does not).
    public var pushedAuthorizationRequestEndpoint: String?

    public var configuredTokenEndpoint: String? { tokenEndpoint }

    public init(authorizationEndpoint: String, tokenEndpoint: String, revocationEndpoint: String? = nil, pkce: Bool = false) {
        self.authorizationEndpoint = authorizationEndpoint
        self.tokenEndpoint = tokenEndpoint
        self.revocationEndpoint = revocationEndpoint
        self.pkce = pkce
    }
}

/// The `oauth2` profile: a plain OAuth 2.0 server that requires client authentication (a secret,
/// a signed assertion or a client certificate) and may burn refresh tokens after one use.
public struct OAuth2Upstream: UpstreamProfile {
    public let settings: UpstreamSettings
    public let oauth2: OAuth2Settings
    private let http: UpstreamHTTP

    public init(settings: UpstreamSettings, httpClient: HTTPClient, logger: Logger) {
        self.init(http: UpstreamHTTP(settings: settings, httpClient: httpClient, logger: logger))
    }

    /// Over a given exchange (tests hand in a transport and a metrics factory).
    init(http: UpstreamHTTP) {
        self.settings = http.settings
        guard let oauth2 = http.settings.profile as? OAuth2Settings else {
            preconditionFailure("an oauth2 upstream without OAuth2Settings")
        }
        self.oauth2 = oauth2
        self.http = http
    }

    static let kind = UpstreamRegistry.Kind(
        decoder: UpstreamKindDecoder(isDefault: true, acceptsKeyCredentials: true) { map, _ in
            let authorize = GatehouseConfiguration.endpoint("authorization_endpoint", in: map)
            let token = GatehouseConfiguration.endpoint("token_endpoint", in: map)
            let revocation = map.value("revocation_endpoint") == nil ? nil : GatehouseConfiguration.endpoint("revocation_endpoint", in: map)
            let pkce = map.bool("pkce") ?? false
            let passwordGrant = map.choice("password_grant", default: OAuth2PasswordGrant.off)
            let challenge = map.value("mfa_challenge_endpoint") == nil ? nil : GatehouseConfiguration.endpoint("mfa_challenge_endpoint", in: map)
            if challenge != nil, passwordGrant != .auth0 {
                map.reader.report(map.childPath("mfa_challenge_endpoint"), map.value("mfa_challenge_endpoint"),
                                  "needs password_grant: auth0 (the second factor of Auth0's password grant)")
            }
            let pushTo = map.value("pushed_authorization_request_endpoint") == nil
                ? nil : GatehouseConfiguration.endpoint("pushed_authorization_request_endpoint", in: map)
            if pushTo == nil, map.string("pushed_authorization_requests") == PushedAuthorizationPolicy.always.rawValue {
                map.reader.report(map.childPath("pushed_authorization_request_endpoint"), map.node,
                                  "is required with pushed_authorization_requests: always (an oauth2 upstream has no discovery)")
            }
            guard let authorize, let token else { return nil }
            var settings = OAuth2Settings(authorizationEndpoint: authorize, tokenEndpoint: token, revocationEndpoint: revocation, pkce: pkce)
            settings.passwordGrant = passwordGrant
            settings.mfaChallengeEndpoint = challenge
            settings.pushedAuthorizationRequestEndpoint = pushTo
            return settings
        },
        make: { OAuth2Upstream(settings: $0, httpClient: $1, logger: $2) })

    public func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        var memo = UpstreamMemo()
        var parameters = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", start.redirectURI), ("state", start.state),
        ]
        if !start.scopes.isEmpty { parameters.append(("scope", start.scopes.joined(separator: " "))) }
        if oauth2.pkce { parameters += start.pkceParameters(remembering: &memo) }
        let pushTo = settings.pushedAuthorization == .never ? nil : oauth2.pushedAuthorizationRequestEndpoint
        let url = try await http.authorizationURL(endpoint: oauth2.authorizationEndpoint, parameters: parameters, pushTo: pushTo,
                                                  tokenEndpoint: oauth2.tokenEndpoint)
        return AuthorizationBegun(url: url, memo: memo)
    }

    public func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        UpstreamGrant(tokens: try await http.exchangeCode(url: oauth2.tokenEndpoint, code: code, redirectURI: redirectURI, memo: memo,
                                                          appCodeVerifier: appCodeVerifier))
    }

    public func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        try await http.refresh(url: oauth2.tokenEndpoint, refreshToken: refreshToken, scope: scope)
    }

    public func revoke(_ token: String, hint: String) async {
        guard let endpoint = oauth2.revocationEndpoint else { return }
        await http.revoke(url: endpoint, token: token, hint: hint, tokenEndpoint: oauth2.tokenEndpoint)
    }

    public var inAppSignIn: (any InAppSignInSteps)? {
        oauth2.passwordGrant == .off ? nil : OAuth2PasswordSteps(oauth2: oauth2, http: http)
    }
}
