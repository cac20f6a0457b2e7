import _CryptoExtras
import AsyncHTTPClient
import Crypto
import Foundation
import GatehouseCore
@testable import GatehouseUpstreams
import JWTKit
import Logging
import NIOCore
import NIOHTTP1
import Testing

/// Client authentication toward an upstream as it leaves Gatehouse: each `client_auth` method's
/// form and headers, `private_key_jwt` assertions verified by JWTKit (not by Gatehouse's code)
/// against the published JWK, pushed authorization requests, and `mtls_endpoint_aliases`. The
/// end-to-end suite runs the same against an authlib server that verifies them
/// (Tests/EndToEnd/test_modern_upstreams.py).
struct ClientAuthenticationTests {
    static let p256 = P256.Signing.PrivateKey()
    static let rsa = try! _RSA.Signing.PrivateKey(keySize: .bits2048)

    static func settings(_ method: ClientAuthentication, keys: [String] = [], algorithm: ClientAssertionAlgorithm? = nil,
                         audience: ClientAssertionAudience = .issuer, par: String? = nil) throws -> UpstreamSettings {
        var oauth2 = OAuth2Settings(authorizationEndpoint: "https://as.example/authorize", tokenEndpoint: "https://as.example/token",
                                    revocationEndpoint: "https://as.example/revoke", pkce: true)
        oauth2.pushedAuthorizationRequestEndpoint = par
        var settings = UpstreamSettings(name: "modern", kind: "oauth2", clientID: "gatehouse", clientSecret: Secret(method.usesSecret ? "s3cret" : ""),
                                        clientAuthentication: method, profile: oauth2)
        if !keys.isEmpty {
            settings.clientAssertion = ClientAssertionSettings(
                keys: try keys.map { try ClientAssertionKey(pem: $0, algorithm: algorithm, keyID: nil) }, audience: audience)
        }
        return settings
    }

    static func form(_ request: HTTPClientRequest) async throws -> [String: String] {
        try await OAuth2PasswordStepsTests.form(request)
    }

    struct AssertionClaims: JWTPayload {
        let iss: String, sub: String, aud: String, jti: String, iat: Int, exp: Int
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    /// The assertion verified with JWTKit against the JWK Gatehouse publishes.
    static func verified(_ assertion: String, publishedKeys: [[String: String]]) async throws -> AssertionClaims {
        let jwks = try JSONSerialization.data(withJSONObject: ["keys": publishedKeys])
        let collection = JWTKeyCollection()
        try await collection.add(jwksJSON: String(decoding: jwks, as: UTF8.self))
        return try await collection.verify(assertion, as: AssertionClaims.self)
    }

    static func header(_ jws: String) throws -> [String: String] {
        let segment = try #require(Base64URL.decode(String(jws.split(separator: ".")[0])))
        return try #require(try JSONSerialization.jsonObject(with: segment) as? [String: String])
    }

    @Test(arguments: [(ClientAssertionAlgorithm.es256, true), (.rs256, false), (.ps256, false)])
    func aPrivateKeyJWTAssertionVerifiesAgainstThePublishedKeyWithItsClaims(algorithm: ClientAssertionAlgorithm, ec: Bool) async throws {
        let pem = ec ? Self.p256.pemRepresentation : Self.rsa.pemRepresentation
        var settings = try Self.settings(.privateKeyJWT, keys: [pem], algorithm: algorithm)
        let now = Date()
        settings.profile = OIDCSettings(issuer: "https://as.example")
        let request = try settings.authenticatedForm(url: "https://as.example/token", [("grant_type", "refresh_token"), ("refresh_token", "rt")],
                                                     tokenEndpoint: "https://as.example/token", now: now)
        #expect(request.headers.first(name: "Authorization") == nil)
        let form = try await Self.form(request)
        #expect(form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        #expect(form["client_id"] == "gatehouse" && form["client_secret"] == nil && form["refresh_token"] == "rt")
        let assertion = try #require(form["client_assertion"])
        let header = try Self.header(assertion)
        #expect(header["alg"] == algorithm.rawValue)
        #expect(header["kid"] == JSONWebKey.thumbprint(of: settings.publishedKeys[0]))
        let claims = try await Self.verified(assertion, publishedKeys: settings.publishedKeys)
        #expect(claims.iss == "gatehouse" && claims.sub == "gatehouse" && claims.aud == "https://as.example")
        #expect(claims.iat == Int(now.timeIntervalSince1970) && claims.exp == claims.iat + 60)
        // Nothing private is published.
        for member in ["d", "p", "q", "dp", "dq", "qi"] { #expect(settings.publishedKeys[0][member] == nil) }
    }

    @Test func everyAssertionHasItsOwnJTIAndTheFirstKeySignsWhileEveryKeyIsPublished() async throws {
        let settings = try Self.settings(.privateKeyJWT, keys: [Self.p256.pemRepresentation, Self.rsa.pemRepresentation])
        #expect(settings.publishedKeys.count == 2)
        #expect(settings.publishedKeysPath == "/upstreams/modern/jwks.json")
        var seen: Set<String> = []
        for _ in 0..<3 {
            let form = try await Self.form(try settings.authenticatedForm(url: "https://as.example/token", [], tokenEndpoint: "https://as.example/token"))
            let assertion = try #require(form["client_assertion"])
            #expect(try Self.header(assertion)["kid"] == settings.publishedKeys[0]["kid"])
            #expect(seen.insert(try await Self.verified(assertion, publishedKeys: [settings.publishedKeys[0]]).jti).inserted)
            // The second key did not sign it.
            await #expect(throws: (any Error).self) { try await Self.verified(assertion, publishedKeys: [settings.publishedKeys[1]]) }
        }
    }

    /// Each row: the audience setting, the issuer, where the assertion is posted, and its `aud`.
    /// The token endpoint's URL is named at the token endpoint only.
    @Test(arguments: [
        (ClientAssertionAudience.issuer, "https://as.example", "https://as.example/token", "https://as.example"),
        (.issuer, "https://as.example", "https://as.example/par", "https://as.example"),
        (.issuer, nil, "https://as.example/token", "https://as.example/token"),
        (.issuer, nil, "https://as.example/par", "https://as.example/par"),
        (.issuer, nil, "https://as.example/revoke", "https://as.example/revoke"),
        (.endpoint, "https://as.example", "https://as.example/token", "https://as.example/token"),
        (.endpoint, "https://as.example", "https://as.example/par", "https://as.example/par"),
        (.endpoint, "https://as.example", "https://mtls.as.example/mfa/challenge", "https://mtls.as.example/mfa/challenge"),
        (.tokenEndpoint, "https://as.example", "https://as.example/token", "https://as.example/token"),
        (.tokenEndpoint, "https://as.example", "https://as.example/revoke", "https://as.example/revoke"),
        (.tokenEndpoint, "https://as.example", "https://other.example/introspect", "https://other.example/introspect"),
        (.url("https://as.example/oauth2"), "https://as.example", "https://as.example/par", "https://as.example/oauth2"),
        (.url("https://as.example/token"), "https://as.example", "https://as.example/token", "https://as.example/token"),
        (.url("https://as.example/token"), "https://as.example", "https://as.example/par", "https://as.example/par"),
    ] as [(ClientAssertionAudience, String?, String, String)])
    func theAudienceNeverNamesTheTokenEndpointAtAnotherEndpoint(audience: ClientAssertionAudience, issuer: String?, postedTo: String,
                                                                expected: String) async throws
    {
        var settings = try Self.settings(.privateKeyJWT, keys: [Self.p256.pemRepresentation], audience: audience)
        if let issuer { settings.profile = OIDCSettings(issuer: issuer) }
        let form = try await Self.form(try settings.authenticatedForm(url: postedTo, [], tokenEndpoint: "https://as.example/token"))
        let claims = try await Self.verified(try #require(form["client_assertion"]), publishedKeys: settings.publishedKeys)
        #expect(claims.aud == expected)
    }

    @Test(arguments: [ClientAuthentication.tlsClientAuth, .selfSignedTLSClientAuth])
    func theMutualTLSMethodsSendTheClientIDAndNoSecret(method: ClientAuthentication) async throws {
        let form = try await Self.form(try Self.settings(method).authenticatedForm(url: "https://as.example/token", [("grant_type", "x")],
                                                                                   tokenEndpoint: "https://as.example/token"))
        #expect(form == ["grant_type": "x", "client_id": "gatehouse"])
    }

    @Test func aFormThatNamesTheClientAlreadyIsNotGivenASecondClientID() async throws {
        let request = try Self.settings(.clientSecretPost).authenticatedForm(url: "https://as.example/par", [("client_id", "gatehouse")],
                                                                             tokenEndpoint: "https://as.example/token")
        var collected = ByteBuffer()
        for try await var chunk in try #require(request.body) { collected.writeBuffer(&chunk) }
        #expect(String(buffer: collected) == "client_id=gatehouse&client_secret=s3cret")
    }

    @Test func aPushedAuthorizationRequestCarriesTheParametersAndTheBrowserOnlyTheRequestURI() async throws {
        let upstream = ScriptedUpstream([.status(201, body: #"{"request_uri":"urn:ietf:params:oauth:request_uri:abc","expires_in":60}"#)])
        let settings = try Self.settings(.privateKeyJWT, keys: [Self.p256.pemRepresentation], par: "https://as.example/par")
        let profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test")))
        let begun = try await profile.beginAuthorization(AuthorizationStart(state: "st", redirectURI: "https://gh.example/oauth/callback",
                                                                            scopes: ["read"], wiring: .callback, appCodeChallenge: "c"))
        #expect(begun.url == "https://as.example/authorize?client_id=gatehouse&request_uri=urn%3Aietf%3Aparams%3Aoauth%3Arequest_uri%3Aabc")
        #expect(upstream.requests.map(\.url) == ["https://as.example/par"])
        let pushed = try await Self.form(upstream.requests[0])
        #expect(pushed["response_type"] == "code" && pushed["state"] == "st" && pushed["redirect_uri"] == "https://gh.example/oauth/callback")
        let verifier = try #require(begun.memo.codeVerifier)
        #expect(pushed["code_challenge_method"] == "S256" && pushed["code_challenge"] == PKCE.challenge(for: verifier))
        // An oauth2 upstream has no issuer: the assertion names the PAR endpoint it is pushed to,
        // never the token endpoint (where it would be good for tokens).
        let claims = try await Self.verified(try #require(pushed["client_assertion"]), publishedKeys: settings.publishedKeys)
        #expect(claims.aud == "https://as.example/par")
    }

    @Test func aRefusedOrUnreadablePushIsABadUpstreamAndNeverTheBrowsersProblem() async throws {
        for (answer, detail) in [(ScriptedUpstream.Answer.status(401, body: #"{"error":"invalid_client"}"#), "(invalid_client)"),
                                 (.status(201, body: "{}"), "no request_uri"), (.status(503), "temporarily unavailable")] {
            let upstream = ScriptedUpstream([answer])
            let settings = try Self.settings(.clientSecretBasic, par: "https://as.example/par")
            let profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test")))
            do {
                _ = try await profile.beginAuthorization(AuthorizationStart(state: "st", redirectURI: "https://gh.example/cb", scopes: [],
                                                                            wiring: .callback, appCodeChallenge: "c"))
                Issue.record("a refused push began a sign-in")
            } catch {
                #expect(error.status == 502 || error.status == 503)
                #expect(error.detail.contains(detail), "\(error.detail)")
            }
        }
    }

    @Test func pushedAuthorizationNeverSendsTheParametersInTheBrowserURLOnlyWhenConfigured() async throws {
        let upstream = ScriptedUpstream([])
        var settings = try Self.settings(.clientSecretBasic, par: "https://as.example/par")
        settings.pushedAuthorization = .never
        let profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test")))
        let begun = try await profile.beginAuthorization(AuthorizationStart(state: "st", redirectURI: "https://gh.example/cb", scopes: [],
                                                                            wiring: .callback, appCodeChallenge: "c"))
        #expect(begun.url.hasPrefix("https://as.example/authorize?response_type=code"))
        #expect(upstream.calls == 0)
    }

    static let discovery = """
        {"issuer":"https://id.example","authorization_endpoint":"https://id.example/authorize","token_endpoint":"https://id.example/token",
         "userinfo_endpoint":"https://id.example/userinfo","revocation_endpoint":"https://id.example/revoke","jwks_uri":"https://id.example/jwks",
         "pushed_authorization_request_endpoint":"https://id.example/par","require_pushed_authorization_requests":true,
         "mtls_endpoint_aliases":{"token_endpoint":"https://mtls.id.example/token","userinfo_endpoint":"https://mtls.id.example/userinfo",
           "revocation_endpoint":"https://mtls.id.example/revoke","pushed_authorization_request_endpoint":"https://mtls.id.example/par",
           "authorization_endpoint":"https://evil.example/authorize"}}
        """

    @Test func withACertificateTheMTLSAliasesAreUsedAndOtherwiseNot() throws {
        let aliased = try OIDCEndpoints.discovered(from: Data(Self.discovery.utf8), issuer: "https://id.example", mutualTLS: true)
        #expect(aliased.token == "https://mtls.id.example/token" && aliased.userinfo == "https://mtls.id.example/userinfo")
        #expect(aliased.revocation == "https://mtls.id.example/revoke" && aliased.pushedAuthorizationRequest == "https://mtls.id.example/par")
        // Only the endpoints a client authenticates to: the browser's stays the document's own.
        #expect(aliased.authorization == "https://id.example/authorize")
        #expect(aliased.tokenAudience == "https://id.example/token" && aliased.requiresPushedAuthorization)
        let plain = try OIDCEndpoints.discovered(from: Data(Self.discovery.utf8), issuer: "https://id.example", mutualTLS: false)
        #expect(plain.token == "https://id.example/token" && plain.pushedAuthorizationRequest == "https://id.example/par")
        // An https issuer's aliases are https too: a document that says otherwise is not used.
        let downgraded = Self.discovery.replacingOccurrences(of: "https://mtls.id.example/token", with: "http://mtls.id.example/token")
        #expect(throws: OAuthError.self) {
            try OIDCEndpoints.discovered(from: Data(downgraded.utf8), issuer: "https://id.example", mutualTLS: true)
        }
    }
}
