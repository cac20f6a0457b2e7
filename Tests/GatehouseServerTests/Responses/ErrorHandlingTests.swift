import GatehouseCore
import HTTPTypes
import HummingbirdTesting
import NIOCore
import Testing

struct ErrorHandlingTests {
    @Test func unknownPathIsProblemJSON404() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: "/nowhere", method: .get)
            #expect(response.status == .notFound)
            #expect(response.headers[.contentType] == "application/problem+json")
            #expect(json(response)["status"] as? Int == 404)
        }
    }

    @Test func wrongMethodIs405WithAllow() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: "/oauth/token", method: .get)
            #expect(response.status == .methodNotAllowed)
            #expect(response.headers[.allow] == "POST")
        }
    }

    @Test(arguments: [
        "grant_type=refresh_token&grant_type=refresh_token&client_id=com.example.app&refresh_token=x",
        "grant_type=refresh_token&client_id=com.example.app&refresh_token=%FF",
        "grant_type=refresh_token&client_id=com.example.app&refresh_token=%",
    ])
    func malformedTokenBodiesAreInvalidRequest(body: String) async throws {
        try await TestGatehouse.withRouter() { test, client in
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let response = try await client.execute(uri: "/oauth/token", method: .post, headers: headers, body: ByteBuffer(string: body))
            #expect(response.status == .badRequest)
            #expect(json(response)["error"] as? String == "invalid_request")
            #expect(test.upstream.recordedCalls.isEmpty)
        }
    }

    @Test func oversizeTokenBodyIs413() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.postToken(["refresh_token": String(repeating: "x", count: 20_000)])
            #expect(response.status == .contentTooLarge)
        }
    }

    @Test func jsonTokenBodyIs415() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.postToken(["grant_type": "refresh_token"], contentType: "application/json")
            #expect(response.status == .unsupportedMediaType)
            #expect(json(response)["error"] as? String == "invalid_request")
        }
    }

    @Test func unknownClientAtTheTokenEndpointIsInvalidClient401() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.postToken(["grant_type": "refresh_token", "refresh_token": "x", "client_id": "nobody"])
            #expect(response.status == .unauthorized)
            #expect(json(response)["error"] as? String == "invalid_client")
        }
    }

    @Test func unsupportedGrantTypeIsNamed() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.postToken(["grant_type": "password", "client_id": "com.example.app"])
            #expect(json(response)["error"] as? String == "unsupported_grant_type")
        }
    }

    @Test func discoveryNamesTheIssuerAndOnlyS256() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let document = json(try await client.execute(uri: "/.well-known/oauth-authorization-server", method: .get))
            #expect(document["issuer"] as? String == "https://gatehouse.example.com")
            #expect(document["token_endpoint"] as? String == "https://gatehouse.example.com/oauth/token")
            #expect(document["code_challenge_methods_supported"] as? [String] == ["S256"])
        }
    }
}
