import GatehouseCore
import HTTPTypes
import HummingbirdTesting
import NIOCore
import Testing

struct AuthorizeRouteTests {
    @Test func validRequestRedirectsUpstreamWithGatehousesOwnState() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: TestGatehouse.authorizeURI(), method: .get)
            #expect(response.status == .found)
            #expect(response.headers[.cacheControl] == "no-store")
            let location = try #require(response.headers[.location])
            #expect(location.hasPrefix("https://as.example.com/authorize?"))
            let parameters = query(of: location)
            let state = try #require(parameters["state"])
            #expect(state != "app-state")
            #expect(Base64URL.decode(state)?.count == 32)  // 256 bits
            #expect(parameters["redirect_uri"] == "https://gatehouse.example.com/oauth/callback")
            #expect(parameters["code_challenge"] == nil)  // this upstream knows no PKCE
        }
    }

    @Test func upstreamThatTakesPKCEGetsGatehousesOwnChallenge() async throws {
        try await TestGatehouse.withRouter(pkce: true) { test, client in
            let location = try await client.execute(uri: TestGatehouse.authorizeURI(), method: .get).headers[.location] ?? ""
            let challenge = try #require(query(of: location)["code_challenge"])
            #expect(challenge != TestGatehouse.challenge)
        }
    }

    @Test func unknownClientShowsAPageAndDoesNotRedirect() async throws {
        try await TestGatehouse.withRouter() { test, client in
            var headers = HTTPFields()
            headers[.accept] = "text/html,application/xhtml+xml"
            let response = try await client.execute(uri: TestGatehouse.authorizeURI(client: "com.evil.app"), method: .get, headers: headers)
            #expect(response.status == .badRequest)
            #expect(response.headers[.location] == nil)
            #expect(response.headers[.contentType]?.hasPrefix("text/html") == true)
            #expect(String(buffer: response.body).contains("unknown_client"))
        }
    }

    @Test(arguments: ["com.example.app:/cb/", "com.example.app:/CB", "com.example.app:/cb?x=1", "com.example.app:/cb#f"])
    func redirectURIThatDiffersIsRefusedAsProblemJSON(redirect: String) async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: TestGatehouse.authorizeURI(redirect: redirect), method: .get)
            #expect(response.status == .badRequest)
            #expect(response.headers[.location] == nil)
            #expect(response.headers[.contentType] == "application/problem+json")
            #expect(json(response)["code"] as? String == "invalid_redirect_uri")
        }
    }

    @Test func plainMethodIsSentBackToTheAppWithItsState() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let uri = "/oauth/authorize?response_type=code&client_id=com.example.app&redirect_uri=com.example.app%3A%2Fcb"
                + "&state=s1&code_challenge=\(TestGatehouse.challenge)&code_challenge_method=plain"
            let response = try await client.execute(uri: uri, method: .get)
            #expect(response.status == .found)
            let parameters = query(of: response.headers[.location] ?? "")
            #expect(parameters["error"] == "invalid_request")
            #expect(parameters["state"] == "s1")
            #expect(parameters["iss"] == "https://gatehouse.example.com")
        }
    }

    @Test(arguments: ["&state=again", "&client_id=x", "&scope=%FF%FE", "&scope=%G1", "&state=%01"])
    func malformedOrDuplicatedParametersAreA400Never500(extra: String) async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: TestGatehouse.authorizeURI(extra: extra), method: .get)
            #expect(response.status == .badRequest)
            #expect(json(response)["code"] as? String == "bad_request")
        }
    }

    /// RFC 6749 §3.1: unrecognized parameters are ignored, even malformed or repeated ones.
    @Test(arguments: ["&bad=%FF%FE", "&bad=%G1", "&x=1&x=2", "&%01=y", "&=z"])
    func unrecognizedParametersAreIgnoredHoweverMalformed(extra: String) async throws {
        try await TestGatehouse.withRouter() { test, client in
            let response = try await client.execute(uri: TestGatehouse.authorizeURI(extra: extra), method: .get)
            #expect(response.status == .found)
            #expect(response.headers[.location]?.hasPrefix("https://as.example.com/authorize") == true)
        }
    }
}
