import Foundation
public import GatehouseCore

/// The `oidc` kind's own settings (and those of kinds built on it, OpenID Connect with presets).
public struct OIDCSettings: UpstreamProfileSettings {
    /// The issuer its ID tokens must name (`iss`), exactly.
    public var issuer: String
    /// Endpoints written down (providers without discovery); `nil` means discovery at
    /// `{issuer}/.well-known/openid-configuration`.
    public var endpoints: OIDCEndpoints?
    /// The one algorithm ID tokens (and signed userinfo) may use: pinned, never `none`.
    public var algorithm: JWSAlgorithm
    public var pkce: Bool
    /// Whether userinfo is fetched (and verified) at sign-in.
    public var fetchesUserinfo: Bool
    /// `acr_values` asked for; the ID token's `acr` must then be this.
    public var acrValues: String?
    /// Allowance for clock skew on `exp` and `iat`.
    public var leeway: Duration
    /// Whether the upstream issues refresh tokens Gatehouse may use.
    public var refreshes: Bool
    /// Other authorization parameters the upstream requires (e.g. `prompt`).
    public var extraAuthorizationParameters: [(String, String)]
    /// A name for logs and documentation (`oidc`, `franceconnect v2`).
    public var dialect: String

    public init(issuer: String, endpoints: OIDCEndpoints? = nil, algorithm: JWSAlgorithm = .rs256, pkce: Bool = true,
                fetchesUserinfo: Bool = true, acrValues: String? = nil, leeway: Duration = .seconds(30), refreshes: Bool = true,
                extraAuthorizationParameters: [(String, String)] = [], dialect: String = "oidc") {
        self.issuer = issuer
        self.endpoints = endpoints
        self.algorithm = algorithm
        self.pkce = pkce
        self.fetchesUserinfo = fetchesUserinfo
        self.acrValues = acrValues
        self.leeway = leeway
        self.refreshes = refreshes
        self.extraAuthorizationParameters = extraAuthorizationParameters
        self.dialect = dialect
    }

    /// Where discovery is read.
    public var discoveryURL: String { issuer + "/.well-known/openid-configuration" }

    public var issuerIdentifier: String? { issuer }

    public var configuredTokenEndpoint: String? { endpoints?.token }
}

/// An OpenID Provider's endpoints (OpenID Connect Discovery 1.0 §3).
public struct OIDCEndpoints: Sendable, Equatable {
    public var authorization: String
    public var token: String
    public var userinfo: String?
    public var jwks: String?
    public var endSession: String?
    public var revocation: String?
    /// The provider says it puts `iss` on every authorization response (RFC 9207 §3): then an
    /// answer without one is refused.
    public var sendsResponseIssuer = false
    /// RFC 9126 §5: where authorization requests are pushed, and whether the provider takes no other.
    public var pushedAuthorizationRequest: String?
    public var requiresPushedAuthorization = false
    /// The token endpoint as the provider names it, whatever `token` is (a mutual-TLS alias): the
    /// `aud` of client assertions that name the token endpoint.
    public var tokenAudience: String

    public init(authorization: String, token: String, userinfo: String? = nil, jwks: String? = nil, endSession: String? = nil,
                revocation: String? = nil) {
        self.authorization = authorization
        self.token = token
        self.userinfo = userinfo
        self.jwks = jwks
        self.endSession = endSession
        self.revocation = revocation
        self.tokenAudience = token
    }

    /// Reads a discovery document, which must name `issuer` exactly (OpenID Connect Discovery §4.3).
    /// With `mutualTLS`, the endpoints Gatehouse authenticates to with its certificate are the
    /// document's `mtls_endpoint_aliases` where it names them (RFC 8705 §5).
    static func discovered(from body: Data, issuer: String, mutualTLS: Bool = false) throws(OAuthError) -> OIDCEndpoints {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] else {
            throw .badUpstream("the upstream's discovery document is not a JSON object")
        }
        guard object["issuer"] as? String == issuer else {
            throw .badUpstream("the upstream's discovery document names another issuer (iss)")
        }
        // An https issuer's endpoints are https too: a document cannot send Gatehouse's client
        // secret to a plain-http (loopback) listener.
        let secure = issuer.hasPrefix("https://")
        let aliases = mutualTLS ? object["mtls_endpoint_aliases"] as? [String: Any] : nil
        func endpoint(_ name: String, aliased: Bool = false) -> String? {
            let named = aliased ? (aliases?[name] ?? object[name]) : object[name]
            guard let text = named as? String, GatehouseConfiguration.problemWithEndpoint(text) == nil,
                  !secure || text.hasPrefix("https://") else { return nil }
            return text
        }
        guard let authorization = endpoint("authorization_endpoint"), let token = endpoint("token_endpoint", aliased: true),
              let tokenAudience = endpoint("token_endpoint") else {
            throw .badUpstream("the upstream's discovery document lacks a usable authorization or token endpoint")
        }
        var endpoints = OIDCEndpoints(authorization: authorization, token: token, userinfo: endpoint("userinfo_endpoint", aliased: true),
                                      jwks: endpoint("jwks_uri"), endSession: endpoint("end_session_endpoint"),
                                      revocation: endpoint("revocation_endpoint", aliased: true))
        endpoints.tokenAudience = tokenAudience
        endpoints.sendsResponseIssuer = object["authorization_response_iss_parameter_supported"] as? Bool == true
        endpoints.pushedAuthorizationRequest = endpoint("pushed_authorization_request_endpoint", aliased: true)
        endpoints.requiresPushedAuthorization = object["require_pushed_authorization_requests"] as? Bool == true
        return endpoints
    }
}

extension OIDCSettings {
    /// The `oidc` kind's keys (docs/configuration.md).
    static func decode(_ map: MappingReader, scopes: [String]) -> OIDCSettings? {
        let issuer = GatehouseConfiguration.endpoint("issuer", in: map)
        if let issuer, issuer.hasSuffix("/") {
            map.reader.report(map.childPath("issuer"), map.value("issuer"), "must not end with '/' (it is compared with iss exactly)")
        }
        let algorithm = map.choice("id_token_signing_alg", default: JWSAlgorithm.rs256)
        if algorithm == .hs256, let method = map.string("client_auth"), !(ClientAuthentication(rawValue: method)?.usesSecret ?? true) {
            map.reader.report(map.childPath("id_token_signing_alg"), map.value("id_token_signing_alg"),
                              "HS256 ID tokens are keyed with the client secret, and client_auth \(method) has none")
        }
        let pkce = map.bool("pkce") ?? true
        let userinfo = map.bool("userinfo") ?? true
        let acr = map.string("acr_values")
        let leeway = map.duration("clock_leeway", in: .seconds(0)...(.seconds(300))) ?? .seconds(30)
        if !scopes.contains("openid") {
            map.reader.report(map.childPath("scopes"), map.value("scopes") ?? map.node, "must include openid")
        }
        guard let issuer else { return nil }
        return OIDCSettings(issuer: issuer, algorithm: algorithm, pkce: pkce, fetchesUserinfo: userinfo, acrValues: acr, leeway: leeway)
    }
}
