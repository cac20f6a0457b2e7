import GatehouseCore
import Testing

struct RedirectURITests {
    static let table: [(registered: String, presented: String, matches: Bool)] = [
        ("com.example.app:/oauth2redirect", "com.example.app:/oauth2redirect", true),
        ("com.example.app:/oauth2redirect", "com.example.app:/oauth2redirect/", false),
        ("com.example.app:/oauth2redirect", "com.example.app:/OAuth2Redirect", false),
        ("com.example.app:/oauth2redirect", "COM.EXAMPLE.APP:/oauth2redirect", false),
        ("com.example.app:/oauth2redirect", "com.example.app:/oauth2redirect?x=1", false),
        ("com.example.app:/oauth2redirect", "com.example.app:/oauth2redirect#frag", false),
        ("https://app.example.com/cb", "https://app.example.com/cb", true),
        ("https://app.example.com/cb", "https://app.example.com/cb/", false),
        ("https://app.example.com/cb", "https://app.example.com:443/cb", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1:51004/callback", true),
        ("http://127.0.0.1/callback", "http://127.0.0.1/callback", true),
        ("http://127.0.0.1:8000/callback", "http://127.0.0.1:9/callback", true),
        ("http://127.0.0.1/callback", "http://127.0.0.1:51004/callback/", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1:51004/callback?x=1", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1:0/callback", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1:65536/callback", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1:abc/callback", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1.evil.example/callback", false),
        ("http://127.0.0.1/callback", "http://127.0.0.1@evil.example/callback", false),
        ("http://127.0.0.1/callback", "http://localhost:51004/callback", false),
        ("http://[::1]/callback", "http://[::1]:8080/callback", true),
    ]

    @Test(arguments: table)
    func matchingIsExactExceptTheLoopbackPort(registered: String, presented: String, matches: Bool) throws {
        let uri = try RedirectURI(registering: registered)
        #expect(uri.matches(presented) == matches, "\(registered) vs \(presented)")
    }

    @Test(arguments: [
        "myapp:/callback",            // not reverse-DNS
        "http://localhost/callback",  // RFC 8252 §8.3
        "http://app.example.com/cb",  // plain http off loopback
        "com.example.app:/cb#frag",   // fragment
        "com.example.app:",           // nothing after the scheme
        "relative/path",
        "",
    ])
    func registrationRefuses(_ text: String) {
        #expect(throws: RedirectURIError.self) { try RedirectURI(registering: text) }
    }

    @Test func parametersAreAppendedAfterAnExistingQuery() {
        #expect(RedirectURI.appending([("code", "a b")], to: "https://x.example/cb?k=v") == "https://x.example/cb?k=v&code=a%20b")
        #expect(RedirectURI.appending([("state", "s/1")], to: "com.example.app:/cb") == "com.example.app:/cb?state=s%2F1")
    }
}
