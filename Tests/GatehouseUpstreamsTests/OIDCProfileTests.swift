import AsyncHTTPClient
import Foundation
import GatehouseCore
@testable import GatehouseUpstreams
import Logging
import Testing

/// The parts of the `oidc` profile that need no provider: reading discovery, and the RFC 9207 `iss` rule.
struct OIDCProfileTests {
    static func document(_ members: [String: Any]) throws -> Data {
        try JSONSerialization.data(withJSONObject: members)
    }

    static var httpsDocument: [String: Any] { [
        "issuer": "https://op.example", "authorization_endpoint": "https://op.example/authorize",
        "token_endpoint": "https://op.example/token", "userinfo_endpoint": "https://op.example/userinfo",
        "jwks_uri": "https://op.example/jwks", "end_session_endpoint": "https://op.example/logout",
    ] }

    @Test func discoveryReadsTheEndpoints() throws {
        let endpoints = try OIDCEndpoints.discovered(from: Self.document(Self.httpsDocument), issuer: "https://op.example")
        #expect(endpoints.token == "https://op.example/token")
        #expect(endpoints.jwks == "https://op.example/jwks")
        #expect(endpoints.endSession == "https://op.example/logout")
        #expect(!endpoints.sendsResponseIssuer)
    }

    @Test func discoveryNamingAnotherIssuerIsRefused() throws {
        #expect(throws: OAuthError.self) {
            try OIDCEndpoints.discovered(from: Self.document(Self.httpsDocument), issuer: "https://other.example")
        }
    }

    @Test func anHTTPSIssuersDocumentCannotSendTheSecretToPlainHTTP() throws {
        var members = Self.httpsDocument
        members["token_endpoint"] = "http://127.0.0.1:9/token"
        #expect(throws: OAuthError.self) {
            try OIDCEndpoints.discovered(from: Self.document(members), issuer: "https://op.example")
        }
        members["token_endpoint"] = "https://op.example/token"
        members["userinfo_endpoint"] = "http://127.0.0.1:9/userinfo"
        let endpoints = try OIDCEndpoints.discovered(from: Self.document(members), issuer: "https://op.example")
        #expect(endpoints.userinfo == nil)
    }

    @Test func aProviderThatPromisesIssMustSendIt() throws {
        var members = Self.httpsDocument
        members["authorization_response_iss_parameter_supported"] = true
        let endpoints = try OIDCEndpoints.discovered(from: Self.document(members), issuer: "https://op.example")
        #expect(endpoints.sendsResponseIssuer)
        let profile = OAuth2Upstream(settings: UpstreamSettings(
            name: "op", kind: "oauth2", clientID: "c", clientSecret: Secret("s"),
            profile: OAuth2Settings(authorizationEndpoint: "https://op.example/authorize", tokenEndpoint: "https://op.example/token")),
                                     httpClient: .shared, logger: .init(label: "test"))
        let promised = UpstreamMemo(nonce: "n", issuer: "https://op.example", requiresResponseIssuer: true)
        #expect(throws: OAuthError.self) { try profile.checkResponseIssuer(nil, memo: promised) }
        #expect(throws: OAuthError.self) { try profile.checkResponseIssuer("https://attacker.example", memo: promised) }
        try profile.checkResponseIssuer("https://op.example", memo: promised)
        // Not promised: an absent iss is accepted, a wrong one never.
        let unpromised = UpstreamMemo(nonce: "n", issuer: "https://op.example")
        try profile.checkResponseIssuer(nil, memo: unpromised)
        #expect(throws: OAuthError.self) { try profile.checkResponseIssuer("https://attacker.example", memo: unpromised) }
    }
}
