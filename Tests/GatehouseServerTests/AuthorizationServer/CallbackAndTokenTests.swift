import Foundation
import GatehouseCore
import HTTPTypes
import HummingbirdTesting
import NIOCore
import Testing

struct CallbackAndTokenTests {
    static func codeGrant(_ code: String, verifier: String? = TestGatehouse.verifier, client: String = "com.example.app",
                          redirect: String = "com.example.app:/cb") -> [String: String] {
        var form = ["grant_type": "authorization_code", "code": code, "client_id": client, "redirect_uri": redirect]
        form["code_verifier"] = verifier
        return form
    }

    @Test func callbackHandsTheAppAOneTimeCodeThatRedeemsForTheUpstreamTokens() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn()
            let callback = try await client.execute(uri: "/oauth/callback?code=upstream-code&state=\(state)", method: .get)
            let parameters = query(of: callback.headers[.location] ?? "")
            #expect(callback.headers[.location]?.hasPrefix("com.example.app:/cb?") == true)
            #expect(parameters["state"] == "app-state")
            #expect(parameters["iss"] == "https://gatehouse.example.com")
            let code = try #require(parameters["code"])
            #expect(code != "upstream-code")

            let response = try await client.postToken(Self.codeGrant(code))
            #expect(response.status == .ok)
            #expect(response.headers[.cacheControl] == "no-store")
            #expect(json(response)["access_token"] as? String == "upstream-at")
            #expect(test.upstream.recordedCalls == ["code:upstream-code:-"])
        }
    }

    @Test func codeUsedTwiceIsRefusedTheSecondTime() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            #expect(try await client.postToken(Self.codeGrant(code)).status == .ok)
            let again = try await client.postToken(Self.codeGrant(code))
            #expect(again.status == .badRequest)
            #expect(json(again)["error"] as? String == "invalid_grant")
        }
    }

    @Test func wrongVerifierIsInvalidGrantAndBurnsTheCode() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            let wrong = try await client.postToken(Self.codeGrant(code, verifier: String(repeating: "a", count: 43)))
            #expect(json(wrong)["error"] as? String == "invalid_grant")
            #expect(json(try await client.postToken(Self.codeGrant(code)))["error"] as? String == "invalid_grant")
        }
    }

    @Test func missingVerifierIsInvalidRequest() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            let response = try await client.postToken(Self.codeGrant(code, verifier: nil))
            #expect(response.status == .badRequest)
            #expect(json(response)["error"] as? String == "invalid_request")
        }
    }

    @Test func redirectURIMustBeTheOneOfTheAuthorizationRequest() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            let response = try await client.postToken(Self.codeGrant(code, redirect: "com.example.app:/cb/"))
            #expect(json(response)["error"] as? String == "invalid_grant")
        }
    }

    @Test func stateReusedAtTheCallbackIsRefused() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn()
            _ = try await client.completeCallback(state: state)
            let again = try await client.execute(uri: "/oauth/callback?code=upstream-code&state=\(state)", method: .get)
            #expect(again.status == .badRequest)
            #expect(again.headers[.location] == nil)
            #expect(json(again)["code"] as? String == "unknown_state")
            #expect(test.upstream.recordedCalls.count == 1)
        }
    }

    @Test func expiredTransactionIsRefusedAtTheCallback() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn()
            test.clock.advance(seconds: 601)
            let response = try await client.execute(uri: "/oauth/callback?code=upstream-code&state=\(state)", method: .get)
            #expect(json(response)["code"] as? String == "unknown_state")
            #expect(test.upstream.recordedCalls.isEmpty)
        }
    }

    @Test func expiredCodeIsInvalidGrant() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            test.clock.advance(seconds: 61)
            #expect(json(try await client.postToken(Self.codeGrant(code)))["error"] as? String == "invalid_grant")
        }
    }

    @Test func upstreamErrorAtTheCallbackGoesBackToTheAppWithItsState() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn()
            let response = try await client.execute(uri: "/oauth/callback?error=access_denied&state=\(state)", method: .get)
            let parameters = query(of: response.headers[.location] ?? "")
            #expect(parameters["error"] == "access_denied")
            #expect(parameters["state"] == "app-state")
        }
    }

    @Test(arguments: [
        (OAuthError.upstreamUnavailable("down"), 503),
        (OAuthError.upstreamTimeout("slow"), 504),
        (OAuthError.badUpstream("not json"), 502),
        (OAuthError.invalidGrant("used"), 400),
    ])
    func refreshRelaysUpstreamFailuresWithTheRightStatus(failure: OAuthError, status: Int) async throws {
        try await TestGatehouse.withRouter() { test, client in
            test.upstream.answer(with: .failure(failure))
            let response = try await client.postToken(["grant_type": "refresh_token", "refresh_token": "rt", "client_id": "com.example.app"])
            #expect(Int(response.status.code) == status)
            #expect(json(response)["error"] as? String == failure.code)
            #expect(response.headers[.cacheControl] == "no-store")
            #expect((response.headers[.retryAfter] != nil) == (status == 503))
        }
    }

    @Test func relayModeChecksTheVerifierBeforeTheCodeGoesUpstream() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn(client: "com.example.relay", redirect: "com.example.relay:/cb")
            var form = Self.codeGrant("upstream-code", verifier: String(repeating: "b", count: 43),
                                      client: "com.example.relay", redirect: "com.example.relay:/cb")
            form["state"] = state
            #expect(json(try await client.postToken(form))["error"] as? String == "invalid_grant")
            #expect(test.upstream.recordedCalls.isEmpty)
        }
    }

    @Test func relayModeSwapsTheUpstreamCodeOnce() async throws {
        try await TestGatehouse.withRouter() { test, client in
            let state = try await client.beginSignIn(client: "com.example.relay", redirect: "com.example.relay:/cb")
            var form = Self.codeGrant("upstream-code", client: "com.example.relay", redirect: "com.example.relay:/cb")
            form["state"] = state
            #expect(json(try await client.postToken(form))["access_token"] as? String == "upstream-at")
            #expect(json(try await client.postToken(form))["error"] as? String == "invalid_grant")
            #expect(test.upstream.recordedCalls == ["code:upstream-code:-"])
        }
    }
}
