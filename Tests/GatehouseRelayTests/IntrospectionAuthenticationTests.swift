import AsyncHTTPClient
import Foundation
import GatehouseCore
@testable import GatehouseRelay
import GatehouseUpstreams
import NIOCore
import Synchronization
import Testing

/// RFC 7662 introspection authenticates as the upstream's token requests do: with
/// `private_key_jwt`, a fresh assertion whose `aud` is what `client_assertion.audience` says,
/// the introspection URL itself for an upstream without an issuer, and never the token endpoint
/// (an assertion naming it would be good for tokens there).
struct IntrospectionAuthenticationTests {
    static let keyFile = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/client-auth/client-key.pem")

    static func upstream(audience: ClientAssertionAudience) throws -> UpstreamSettings {
        var settings = UpstreamSettings(
            name: "legacy", kind: "oauth2", clientID: "gatehouse", clientSecret: Secret(""), clientAuthentication: .privateKeyJWT,
            profile: OAuth2Settings(authorizationEndpoint: "https://as.example/authorize", tokenEndpoint: "https://as.example/token"))
        let key = try ClientAssertionKey(pem: try String(contentsOf: keyFile, encoding: .utf8), algorithm: nil, keyID: nil)
        settings.clientAssertion = ClientAssertionSettings(keys: [key], audience: audience)
        return settings
    }

    static func claims(of request: HTTPClientRequest) async throws -> [String: Any] {
        var collected = ByteBuffer()
        for try await var chunk in try #require(request.body) { collected.writeBuffer(&chunk) }
        let form = try FormParameters(parsing: collected.readableBytesView)
        #expect(form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        #expect(form["client_id"] == "gatehouse" && form["client_secret"] == nil && form["token"] == "at-1")
        let assertion = try #require(form["client_assertion"])
        let payload = try #require(assertion.split(separator: ".").dropFirst().first.flatMap { Base64URL.decode(String($0)) })
        return try #require(try JSONSerialization.jsonObject(with: payload) as? [String: Any])
    }

    @Test(arguments: [(ClientAssertionAudience.issuer, "https://as.example/introspect"), (.endpoint, "https://as.example/introspect"),
                      (.tokenEndpoint, "https://as.example/introspect"), (.url("https://as.example"), "https://as.example"),
                      (.url("https://as.example/token"), "https://as.example/introspect")])
    func theAssertionNamesTheIntrospectionEndpointOrTheURLConfiguredNeverTheTokenEndpoint(audience: ClientAssertionAudience, expected: String)
        async throws
    {
        let sent = Mutex<[HTTPClientRequest]>([])
        let http = IdentityHTTP(upstream: "legacy", timeout: .seconds(5), limit: ConcurrencyLimit(limit: 4)) { request, _ in
            sent.withLock { $0.append(request) }
            return (200, Data(#"{"active":true,"sub":"ada"}"#.utf8))
        }
        let settings = IdentitySettings(kind: .introspection, url: "https://as.example/introspect")
        let resolver = IntrospectionResolver(settings: settings, upstream: try Self.upstream(audience: audience), http: http)
        _ = try await resolver.resolve(token: "at-1")
        _ = try await resolver.resolve(token: "at-1")
        let requests = sent.withLock { $0 }
        #expect(requests.map(\.url) == ["https://as.example/introspect", "https://as.example/introspect"])
        let first = try await Self.claims(of: requests[0]), second = try await Self.claims(of: requests[1])
        #expect(first["aud"] as? String == expected && first["iss"] as? String == "gatehouse" && first["sub"] as? String == "gatehouse")
        #expect(first["jti"] as? String != second["jti"] as? String)
    }
}
