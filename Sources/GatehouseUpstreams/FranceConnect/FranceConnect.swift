import Foundation
public import GatehouseCore

/// The `franceconnect` kind: FranceConnect (v1 or v2) is OpenID Connect with its own rules,
/// so this kind is presets over `OIDCUpstream`. Each rule, and where it is enforced:
///
/// - v2 issuer `https://oidc.franceconnect.gouv.fr/api/v2` (integration
///   `https://fcp-low.integ01.dev-franceconnect.fr/api/v2`), endpoints from discovery; ID token
///   and userinfo (`application/jwt`) signed ES256 (default) or RS256, keys from its JWKS
///   (`OIDCUpstream`, `IDTokenValidator`, `UserinfoVerifier`).
/// - v1 endpoints `{base}/authorize|token|userinfo|logout` under `https://app.franceconnect.gouv.fr/api/v1`
///   (integration `https://fcp.integ01.dev-franceconnect.fr/api/v1`); its ID tokens name the bare
///   origin as `iss` and are HS256 keyed with the client secret; userinfo is JSON.
/// - `state` and `nonce` of at least 32 characters: Gatehouse's are 43 (`SecureToken`).
/// - `acr_values=eidas1` by default, and the ID token's `acr` must equal what was asked.
/// - The identity-pivot scopes by default; `openid` is required.
/// - `client_secret_post` by default (FranceConnect v2 refuses HTTP Basic).
/// - No refresh token, access tokens of about 60 s: the profile never refreshes (`canRefresh`),
///   and the relay's identity comes from the userinfo kept in the session (`identity: {kind: session}`, the default).
public enum FranceConnect {
    public enum Version: String, Sendable, CaseIterable { case v1, v2 }
    public enum Platform: String, Sendable, CaseIterable { case production, integration }

    /// The identity pivot (FranceConnect's "scopes" documentation).
    public static let pivotScopes = ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry"]

    /// Where each platform lives: v2's issuer, v1's endpoint base.
    public static func base(version: Version, platform: Platform) -> String {
        switch (version, platform) {
        case (.v2, .production): "https://oidc.franceconnect.gouv.fr/api/v2"
        case (.v2, .integration): "https://fcp-low.integ01.dev-franceconnect.fr/api/v2"
        case (.v1, .production): "https://app.franceconnect.gouv.fr/api/v1"
        case (.v1, .integration): "https://fcp.integ01.dev-franceconnect.fr/api/v1"
        }
    }

    /// The OpenID Connect settings a FranceConnect version and base stand for.
    public static func settings(version: Version, base: String, algorithm: JWSAlgorithm, acrValues: String, leeway: Duration) -> OIDCSettings {
        switch version {
        case .v2:
            return OIDCSettings(issuer: base, algorithm: algorithm, pkce: false, fetchesUserinfo: true, acrValues: acrValues,
                                leeway: leeway, refreshes: false, dialect: "franceconnect v2")
        case .v1:
            return OIDCSettings(
                issuer: origin(of: base),
                endpoints: OIDCEndpoints(authorization: base + "/authorize", token: base + "/token", userinfo: base + "/userinfo",
                                         endSession: base + "/logout"),
                algorithm: .hs256, pkce: false, fetchesUserinfo: true, acrValues: acrValues, leeway: leeway, refreshes: false,
                dialect: "franceconnect v1")
        }
    }

    /// `https://host[:port]` of a URL: FranceConnect v1's ID tokens name it as their issuer.
    static func origin(of url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        let rest = url[schemeEnd.upperBound...]
        return String(url[..<schemeEnd.upperBound]) + String(rest.prefix { $0 != "/" })
    }

    static let kind = UpstreamRegistry.Kind(
        decoder: UpstreamKindDecoder(defaultScopes: pivotScopes, defaultIdentity: IdentitySettings(kind: .session, url: ""),
                                     keepsIdentity: true, defaultClientAuthentication: .clientSecretPost) { map, scopes in
            let version = map.choice("version", default: Version.v2)
            let platform = map.choice("platform", default: Platform.production)
            let issuer = map.value("issuer") == nil ? nil : GatehouseConfiguration.endpoint("issuer", in: map)
            if let issuer, issuer.hasSuffix("/") {
                map.reader.report(map.childPath("issuer"), map.value("issuer"), "must not end with '/'")
            }
            var algorithm = map.choice("id_token_signing_alg", default: version == .v2 ? JWSAlgorithm.es256 : .hs256)
            switch (version, algorithm) {
            case (.v1, .hs256), (.v2, .es256), (.v2, .rs256): break
            case (.v1, _):
                map.reader.report(map.childPath("id_token_signing_alg"), map.value("id_token_signing_alg"),
                                  "FranceConnect v1 signs ID tokens with HS256 only")
                algorithm = .hs256
            case (.v2, _):
                map.reader.report(map.childPath("id_token_signing_alg"), map.value("id_token_signing_alg"),
                                  "FranceConnect v2 signs with ES256 or RS256")
            }
            let acr = map.string("acr_values") ?? "eidas1"
            let leeway = map.duration("clock_leeway", in: .seconds(0)...(.seconds(300))) ?? .seconds(30)
            if !scopes.contains("openid") {
                map.reader.report(map.childPath("scopes"), map.value("scopes") ?? map.node, "must include openid")
            }
            return settings(version: version, base: issuer ?? base(version: version, platform: platform), algorithm: algorithm,
                            acrValues: acr, leeway: leeway)
        },
        make: { settings, client, logger in
            guard let oidc = settings.profile as? OIDCSettings else { preconditionFailure("a franceconnect upstream without OIDCSettings") }
            return OIDCUpstream(settings: settings, oidc: oidc, httpClient: client, logger: logger)
        })
}
