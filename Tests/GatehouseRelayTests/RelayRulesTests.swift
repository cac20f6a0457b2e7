import Foundation
import GatehouseCore
import GatehouseRelay
import Testing

struct RelayRulesTests {
    static let route = RouteSettings(prefix: "/api/contracts", backend: "http://127.0.0.1:1/contracts", upstream: "u",
                                     identityHeaders: [(name: "X-BPId", source: "bpid")])

    @Test(arguments: [
        ("/api/contracts", true), ("/api/contracts/1", true), ("/api/contractsX", false), ("/api", false), ("/api/contract", false),
    ])
    func prefixOwnsPathsOnSegmentBoundaries(path: String, owned: Bool) {
        #expect(Self.route.owns(path) == owned)
    }

    @Test func longestPrefixWins() {
        let configuration = GatehouseConfiguration(
            server: ServerSettings(publicBaseURL: "https://g.example"), store: StoreSettings(sqlitePath: ":memory:"),
            upstreams: [:], clients: [:],
            routes: [RouteSettings(prefix: "/api", backend: "http://b/1", upstream: "u"),
                     RouteSettings(prefix: "/api/contracts", backend: "http://b/2", upstream: "u")])
        #expect(configuration.route(for: "/api/contracts/9")?.backend == "http://b/2")
        #expect(configuration.route(for: "/api/other")?.backend == "http://b/1")
        #expect(configuration.route(for: "/oauth/token") == nil)
        // Path parameters never let a request slip past the stricter, longer prefix.
        #expect(configuration.route(for: "/api/contracts;x/9")?.backend == "http://b/2")
        #expect(configuration.route(for: "/api;a/contracts;b=c/9")?.backend == "http://b/2")
    }

    @Test func identityAndHopByHopHeadersNeverCross() {
        let policy = RelayHeaderPolicy(route: Self.route, allIdentityHeaders: ["x-subject"])
        for name in ["x-bpid", "x-subject", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                     "proxy-authorization", "x-forwarded-for", "forwarded", "host", "authorization"] {
            #expect(!policy.forwardsRequestHeader(name, connectionTokens: []), "\(name)")
        }
        #expect(!policy.forwardsRequestHeader("x-secret-hop", connectionTokens: ["x-secret-hop"]))
        #expect(policy.forwardsRequestHeader("accept", connectionTokens: []))
        #expect(!RelayHeaderPolicy.forwardsResponseHeader("keep-alive", connectionTokens: []))
        #expect(RelayHeaderPolicy.forwardsResponseHeader("etag", connectionTokens: []))
    }

    @Test func underscoreVariantsOfIdentityHeadersNeverCross() {
        let policy = RelayHeaderPolicy(route: Self.route, allIdentityHeaders: [])
        for name in ["X_BPId", "x_bpid", "X-BPId"] {
            #expect(!policy.forwardsRequestHeader(name, connectionTokens: []), "\(name)")
            #expect(!policy.forwardsRequestHeader(name.lowercased(), connectionTokens: []), "\(name)")
        }
        #expect(!policy.forwardsRequestHeader("Transfer_Encoding", connectionTokens: []))
    }

    @Test func passthroughKeepsTheAuthorizationHeader() {
        var route = Self.route
        route.authorization = .passthrough
        #expect(RelayHeaderPolicy(route: route, allIdentityHeaders: []).forwardsRequestHeader("authorization", connectionTokens: []))
    }

    @Test func ruleNamesWhatIsMissing() {
        let identity = CallerIdentity(subject: "bob", bpid: "1", scopes: ["read"], attributes: ["bpid_status": "blocked"], expiresAt: nil)
        #expect(RouteRule(scopes: ["read"]).violation(by: identity) == nil)
        #expect(RouteRule(scopes: ["write"]).violation(by: identity) == "this route requires the scope 'write'")
        #expect(RouteRule(attributes: ["bpid_status": "active"]).violation(by: identity) == "this route requires 'bpid_status' to be 'active'")
        #expect(RouteRule(attributes: ["bpid": "*"]).violation(by: identity) == nil)
        #expect(RouteRule(attributes: ["email": "*"]).violation(by: identity) == "this route requires a value for 'email'")
    }

    @Test func compactIdentityKeepsEmptyAndAbsentApart() {
        let names = AttributeNames(["a", "b", "c"])
        let identity = CallerIdentity(subject: nil, bpid: nil, scopeText: nil, attributeNames: names,
                                      attributeValues: ["x", "", nil], expiresAt: nil)
        #expect(identity.attributes == ["a": "x", "b": ""])
        #expect(identity.value(of: "c") == nil)
        #expect(identity.value(of: "b") == "")
    }

    @Test func jsonPointerFollowsRFC6901() throws {
        let document = try JSONSerialization.jsonObject(with: Data(#"{"a/b":{"m~n":[10,"x"]},"t":true}"#.utf8))
        #expect(JSONPointer("/a~1b/m~0n/1")?.string(in: document) == "x")
        #expect(JSONPointer("/a~1b/m~0n/0")?.string(in: document) == "10")
        #expect(JSONPointer("/t")?.string(in: document) == "true")
        #expect(JSONPointer("/missing")?.string(in: document) == nil)
        #expect(JSONPointer("no-slash") == nil)
        #expect(JSONPointer("/bad~2escape") == nil)
    }
}
