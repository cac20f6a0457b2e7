import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseUpstreams
import Hummingbird

extension AuthorizationServer {
    /// `GET /.well-known/oauth-authorization-server` (RFC 8414 §3) and, with `openID`,
    /// `GET /.well-known/openid-configuration` (OpenID Connect Discovery 1.0 §4), the one document
    /// AppAuth fetches (iOS `discoverServiceConfigurationForIssuer:`, Android `fetchFromIssuer`):
    /// the same endpoints and issuer (the `iss` of Gatehouse's ID tokens), plus the members
    /// Discovery requires (`jwks_uri`, `subject_types_supported`, `id_token_signing_alg_values_supported`).
    func metadata(openID: Bool = false) -> Response {
        let scopes = Set(configuration.clients.values.flatMap(\.scopes)).sorted()
        var document = AuthorizationServerMetadata(
            issuer: issuer,
            authorization_endpoint: issuer + "/oauth/authorize",
            token_endpoint: issuer + "/oauth/token",
            revocation_endpoint: issuer + "/oauth/revoke",
            response_types_supported: ["code"],
            response_modes_supported: ["query"],
            grant_types_supported: ["authorization_code", "refresh_token"],
            code_challenge_methods_supported: ["S256"],
            token_endpoint_auth_methods_supported: ["none"],
            scopes_supported: scopes,
            authorization_response_iss_parameter_supported: true,
            userinfo_endpoint: issuer + "/userinfo",
            end_session_endpoint: issuer + "/oauth/logout",
            jwks_uri: publishedKeys.isEmpty && !openID ? nil : issuer + "/.well-known/jwks.json",
            id_token_signing_alg_values_supported: signer == nil && !openID ? nil : ["ES256"],
            registration_endpoint: configuration.clients.values.contains { $0.instances != nil } ? issuer + "/oauth/register" : nil,
            dpop_signing_alg_values_supported: configuration.clients.values.contains { $0.dpop != .off || $0.inAppSignIn == .on }
                ? Self.dpopAlgorithms : nil)
        if configuration.offersInAppSignIn {
            document.authorization_challenge_endpoint = issuer + InAppSignIn.path
        }
        if openID {
            document.subject_types_supported = ["public"]
            document.claims_supported = ["iss", "sub", "aud", "exp", "iat", "nonce", "sid"]
        }
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "public, max-age=300"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: JSONCoding.encode(document))))
    }

    /// The DPoP proof algorithms Gatehouse verifies (RFC 9449 §5.1, and `algs` of its `WWW-Authenticate: DPoP`).
    static let dpopAlgorithms = ["ES256", "RS256", "PS256", "EdDSA"]

    /// `GET /.well-known/jwks.json` (RFC 7517): Gatehouse's ES256 key (assertions toward backends,
    /// ID tokens) and the keys of the access tokens it mints for upstreams whose kind mints them.
    /// With no key (no ID tokens, no minted tokens), an empty set: discovery names this URL always.
    func jwks() -> Response {
        let keys = publishedKeys
        var response = Response.json(["keys": keys], status: .ok)
        response.headers[.cacheControl] = "public, max-age=300"
        return response
    }

    /// Every public key Gatehouse signs with, each once.
    var publishedKeys: [[String: String]] {
        var keys = signer?.jwks["keys"] ?? []
        var seen = Set(keys.compactMap { $0["kid"] })
        for name in upstreams.keys.sorted() {
            for key in upstreams[name]?.minter?.publicKeys ?? [] where seen.insert(key["kid"] ?? "").inserted {
                keys.append(key)
            }
        }
        return keys
    }
}

/// RFC 8414 §2 member names, as they appear on the wire.
struct AuthorizationServerMetadata: Encodable {
    let issuer: String
    let authorization_endpoint: String
    let token_endpoint: String
    let revocation_endpoint: String
    let response_types_supported: [String]
    let response_modes_supported: [String]
    let grant_types_supported: [String]
    let code_challenge_methods_supported: [String]
    let token_endpoint_auth_methods_supported: [String]
    let scopes_supported: [String]
    let authorization_response_iss_parameter_supported: Bool
    let userinfo_endpoint: String
    let end_session_endpoint: String
    let jwks_uri: String?
    let id_token_signing_alg_values_supported: [String]?
    /// RFC 7591: where app instances register, when an app has `instances`.
    var registration_endpoint: String? = nil
    /// RFC 9449 §5.1: the proof algorithms Gatehouse checks, when an app's tokens may be bound.
    var dpop_signing_alg_values_supported: [String]? = nil
    /// draft-ietf-oauth-first-party-apps §4.1: the in-app sign-in, when an app has it.
    var authorization_challenge_endpoint: String? = nil
    /// OpenID Connect Discovery 1.0 §3 (the openid-configuration document only).
    var subject_types_supported: [String]? = nil
    var claims_supported: [String]? = nil
}

