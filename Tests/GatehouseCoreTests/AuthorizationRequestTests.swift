import GatehouseCore
import Testing

struct AuthorizationRequestTests {
    static let challenge = PKCE.challenge(for: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
    static let clients: [String: AppClient] = {
        let client = AppClient(clientID: "com.example.app", upstream: "legacy",
                               redirectURIs: [try! RedirectURI(registering: "com.example.app:/cb")], scopes: ["read", "write"])
        return [client.clientID: client]
    }()

    static func request(_ changes: [String: String?]) -> FormParameters {
        var values = ["response_type": "code", "client_id": "com.example.app", "redirect_uri": "com.example.app:/cb",
                      "state": "app-state", "code_challenge": challenge, "code_challenge_method": "S256"]
        for (key, value) in changes { values[key] = value }
        return FormParameters(values)
    }

    @Test func validRequestProceedsWithTheClientsScopes() {
        guard case .proceed(let request) = AuthorizationRequest.decide(Self.request([:]), clients: Self.clients) else {
            Issue.record("expected to proceed"); return
        }
        #expect(request.scopes == ["read", "write"])
        #expect(request.state == "app-state")
    }

    @Test func unknownClientIsRefusedNotRedirected() {
        let decision = AuthorizationRequest.decide(Self.request(["client_id": "evil"]), clients: Self.clients)
        #expect(decision == .refuse(.unknownClient("No app is registered with this client_id.")))
    }

    @Test(arguments: ["com.example.app:/cb/", "com.example.app:/CB", "com.example.app:/cb?x=1", "com.example.app:/cb#f", nil])
    func unregisteredRedirectIsRefusedNotRedirected(redirect: String?) {
        let decision = AuthorizationRequest.decide(Self.request(["redirect_uri": redirect]), clients: Self.clients)
        guard case .refuse(let problem) = decision else { Issue.record("expected a refusal"); return }
        #expect(problem.code == "invalid_redirect_uri")
    }

    @Test(arguments: [
        (["code_challenge_method": "plain"], "invalid_request"),
        (["code_challenge_method": nil], "invalid_request"),
        (["code_challenge": nil], "invalid_request"),
        (["code_challenge": "short"], "invalid_request"),
        (["state": nil], "invalid_request"),
        (["response_type": "token"], "unsupported_response_type"),
        (["scope": "read admin"], "invalid_scope"),
    ] as [([String: String?], String)])
    func badParametersGoBackToTheApp(changes: [String: String?], error: String) {
        let decision = AuthorizationRequest.decide(Self.request(changes), clients: Self.clients)
        guard case .redirectError(let uri, let oauthError, _) = decision else { Issue.record("expected a redirect"); return }
        #expect(uri == "com.example.app:/cb")
        #expect(oauthError.code == error)
    }
}
