import GatehouseRelay
import Testing

/// The original request as each ingress describes it, in the headers its documentation names
/// (docs/relay.md, "Behind your ingress").
struct ForwardedRequestTests {
    static func read(_ headers: [(String, String)], method: String = "GET", envoy: String? = nil) -> Result<ForwardedRequest, ForwardedRequestError> {
        ForwardedRequest.read({ name in headers.filter { $0.0.lowercased() == name }.map(\.1) }, ownMethod: method, envoyTarget: envoy)
    }

    @Test func nginxAuthRequestNamesTheMethodAndTheRawURI() throws {
        let read = try Self.read([("X-Original-Method", "DELETE"), ("X-Original-URI", "/api/contracts/42?x=%2F"),
                                  ("X-Forwarded-Proto", "http"), ("X-Forwarded-Host", "api.example.com:8443"), ("Host", "gatehouse:8080")],
                                 method: "GET").get()
        #expect(read == ForwardedRequest(method: "DELETE", target: "/api/contracts/42?x=%2F", scheme: "http", host: "api.example.com:8443"))
    }

    @Test func ingressNginxSendsTheWholeURL() throws {
        // ingress-nginx's auth-url: X-Original-URL $scheme://$http_host$request_uri, X-Original-Method.
        let read = try Self.read([("X-Original-URL", "https://api.example.com/api/contracts?a=1"), ("X-Original-Method", "POST"),
                                  ("X-Forwarded-Proto", "http"), ("Host", "gatehouse")]).get()
        #expect(read == ForwardedRequest(method: "POST", target: "/api/contracts?a=1", scheme: "https", host: "api.example.com"))
        let bare = try Self.read([("X-Original-URL", "https://api.example.com?a=1"), ("X-Original-Method", "GET")]).get()
        #expect(bare.target == "/?a=1")
    }

    @Test func caddyAndTraefikUseTheForwardedFamily() throws {
        let read = try Self.read([("X-Forwarded-Method", "PUT"), ("X-Forwarded-Uri", "/api/x"), ("X-Forwarded-Proto", "HTTPS"),
                                  ("X-Forwarded-Host", "app.example.com, proxy.internal"), ("Host", "127.0.0.1:9000")]).get()
        #expect(read == ForwardedRequest(method: "PUT", target: "/api/x", scheme: "https", host: "app.example.com"))
    }

    @Test func envoyKeepsTheMethodAndPutsThePathAfterThePrefix() throws {
        let read = try Self.read([("Host", "api.example.com"), ("X-Original-Method", "DELETE")], method: "PATCH", envoy: "/api/x?y=1").get()
        #expect(read == ForwardedRequest(method: "PATCH", target: "/api/x?y=1", scheme: "https", host: "api.example.com"))
    }

    @Test func theHostFallsBackToHostAndTheSchemeToHTTPS() throws {
        let read = try Self.read([("X-Original-Method", "GET"), ("X-Original-URI", "/api"), ("Host", "edge.example.com")]).get()
        #expect(read.scheme == "https")
        #expect(read.host == "edge.example.com")
    }

    @Test(arguments: [
        [("Host", "x")],
        [("X-Original-Method", "GET")],
        [("X-Original-URI", "/api")],
    ])
    func withoutOneMethodAndOneURINothingIsGuessed(headers: [(String, String)]) {
        #expect(throws: ForwardedRequestError.missing) { try Self.read(headers).get() }
    }

    /// A client's own `X-Original-URL` passed on next to the ingress's `X-Original-URI` (nginx
    /// forwards every client header to the auth location) must never choose the route judged.
    @Test(arguments: [
        [("X-Original-Method", "GET"), ("X-Original-Method", "POST"), ("X-Original-URI", "/api")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/api"), ("X-Original-URI", "/admin")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/admin"), ("X-Original-URL", "https://x/api")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/admin"), ("X-Forwarded-Uri", "/api")],
        [("X-Forwarded-Method", "GET"), ("X-Forwarded-Uri", "/admin"), ("X-Original-URI", "/api")],
        [("X-Forwarded-Method", "DELETE"), ("X-Original-Method", "GET"), ("X-Forwarded-Uri", "/api")],
    ])
    func twoDescriptionsAreRefusedNotChosenBetween(headers: [(String, String)]) {
        #expect {
            try Self.read(headers).get()
        } throws: { error in
            if case .ambiguous = error as? ForwardedRequestError { true } else { false }
        }
    }

    @Test(arguments: [
        [("X-Original-Method", "GET"), ("X-Original-URI", "api/x")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/api/x y")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/api/\u{7F}")],
        [("X-Original-Method", "G ET"), ("X-Original-URI", "/api")],
        [("X-Original-Method", "GET"), ("X-Original-URL", "ftp://x/api")],
        [("X-Original-Method", "GET"), ("X-Original-URL", "https://user@evil/api")],
        [("X-Original-Method", "GET"), ("X-Original-URL", "https://api.example.com/api/c/1#/../../admin")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/api"), ("X-Forwarded-Proto", "gopher")],
        [("X-Original-Method", "GET"), ("X-Original-URI", "/api"), ("X-Forwarded-Host", "a/b")],
    ])
    func malformedDescriptionsAreRefused(headers: [(String, String)]) {
        #expect(throws: ForwardedRequestError.self) { try Self.read(headers).get() }
    }

    /// A public request that a trusted proxy relayed to `/forward-auth` is not a question.
    @Test(arguments: [("gatehouse.example.com", true), ("GATEHOUSE.example.com:443", true), ("gatehouse.example.com:8443", false),
                      ("gatehouse.internal:8080", false), ("api.example.com", false)])
    func aQuestionThroughThePublicHostIsRefused(host: String, refused: Bool) {
        let screened = ForwardedRequest.screen(authority: host, publicAuthority: "gatehouse.example.com", publicScheme: "https", names: ["Host"])
        #expect((screened == .public) == refused)
    }

    /// Headers a backend would read as another method, URL or user, in any case and with `_`.
    @Test(arguments: ["X-HTTP-Method-Override", "x-http-method", "X_Method_Override", "X-Rewrite-URL", "X-Original-Host",
                      "Remote-User", "X-WEBAUTH-USER", "x-forwarded-user", "X-Auth-Request-Email"])
    func aQuestionCarryingAnOverrideIsRefused(name: String) {
        #expect(ForwardedRequest.screen(authority: "gatehouse.internal", publicAuthority: "gatehouse.example.com", publicScheme: "https",
                                        names: ["Authorization", name]) == .smuggled(name))
    }

    @Test func theIngressesOwnHeadersAreRead() {
        let names = ["X-Original-URL", "X-Original-URI", "X-Original-Method", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host",
                     "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Port", "X-Real-IP", "X-Auth-Request-Redirect", "X-Sent-From"]
        #expect(ForwardedRequest.screen(authority: "gatehouse.internal", publicAuthority: "gatehouse.example.com", publicScheme: "https",
                                        names: names) == nil)
    }

    @Test func errorsNameTheHeadersToSet() {
        #expect(ForwardedRequestError.missing.detail.contains("X-Original-URI"))
        #expect(ForwardedRequestError.missing.detail.contains("X-Forwarded-Uri"))
    }
}
