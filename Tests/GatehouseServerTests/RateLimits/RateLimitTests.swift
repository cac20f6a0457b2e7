import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseRelay
@testable import GatehouseServer
import GatehouseStore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import Testing

/// An identity service that names the caller after the token (`alice-token` → `alice`) or finds
/// it inactive, counting its calls; or that is too busy to be asked (`overloaded`).
final class NamingResolver: IdentityResolver {
    enum Answer: Sendable { case bySubject, inactive, overloaded }

    let calls = Atomic<Int>(0)
    let answer: Answer

    init(_ answer: Answer) {
        self.answer = answer
    }

    func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        switch answer {
        case .overloaded:
            // What the identity concurrency limit throws: no call made.
            throw IdentityUnavailable(.overloaded, "identity_concurrency calls in flight")
        case .inactive:
            calls.add(1, ordering: .relaxed)
            return .inactive
        case .bySubject:
            calls.add(1, ordering: .relaxed)
            let subject = token.hasSuffix("-token") ? String(token.dropLast(6)) : token
            return .active(CallerIdentity(subject: subject, bpid: nil, scopes: ["read"], attributes: [:], expiresAt: nil))
        }
    }
}

/// `rate_limits`: the `/oauth/*` buckets per client and per address (behind trusted proxies
/// only), the relay's per-subject bucket, and identity look-ups per address.
struct RateLimitTests {
    /// A route whose backend refuses connections: a request the limits let through is tried
    /// there and ends 502 or 504 (`reachedTheBackend`), within a short timeout.
    static let route = RouteSettings(prefix: "/api", backend: "http://127.0.0.1:9/b", upstream: "legacy", timeout: .milliseconds(300))

    static func reachedTheBackend(_ response: TestResponse) -> Bool {
        response.status == .badGateway || response.status == .gatewayTimeout
    }
    /// A bucket of `burst` that does not refill within a test.
    static func slow(_ burst: Int) -> BucketSettings { BucketSettings(perSecond: 0.001, burst: burst) }

    static var quietAudit: AuditLog {
        var logger = Logger(label: AuditLog.label)
        logger.logLevel = .critical
        return AuditLog(logger: logger)
    }

    /// Runs `body` against the test Gatehouse with `limits`, `audit` and, when `resolver` is
    /// given, the `/api` route over it; `upstream` wraps the scripted upstream.
    static func withGatehouse(limits: RateLimitSettings = RateLimitSettings(), audit: AuditLog = quietAudit,
                              resolver: (any IdentityResolver)? = nil,
                              upstream wrap: @Sendable (ScriptedUpstream) -> any UpstreamProfile = { $0 },
                              mode: TestingSetup = .router,
                              _ body: @Sendable (TestGatehouse, any TestClientProtocol) async throws -> Void) async throws
    {
        let base = try await TestGatehouse.make()
        var configuration = base.gatehouse.configuration
        configuration.operations.rateLimits = limits
        var relay: RelayServices?
        if let resolver {
            configuration.routes = [route]
            configuration.upstreams["legacy"]?.identity = IdentitySettings(kind: .introspection, url: "https://as.example.com/introspect")
            relay = RelayServices(configuration: configuration, cache: IdentityCache(maximumEntries: 100), resolvers: ["legacy": resolver],
                                  backendClient: HTTPClient.shared, signer: nil)
        }
        let gatehouse = Gatehouse(configuration: configuration, store: base.store, upstreams: ["legacy": wrap(base.upstream)], relay: relay,
                                  sessions: base.gatehouse.sessions, now: base.gatehouse.now, logger: base.gatehouse.logger, audit: audit)
        let test = TestGatehouse(gatehouse: gatehouse, upstream: base.upstream, clock: base.clock, store: base.store)
        do {
            try await Application(router: GatehouseApplication.router(for: gatehouse)).test(mode) { client in
                try await body(test, client)
            }
        } catch {
            try await base.store.close()
            throw error
        }
        try await base.store.close()
    }

    /// A code grant with a code nobody issued: the token endpoint answers `invalid_grant`.
    static func junkCodeGrant(client: String) -> [String: String] {
        CallbackAndTokenTests.codeGrant("junk-code", client: client, redirect: client + ":/cb")
    }

    static func retryAfter(_ response: TestResponse) -> Int? {
        response.headers[.retryAfter].flatMap(Int.init)
    }

    // MARK: /oauth/* per client

    @Test func clientOverItsLimitGets429WithRetryAfterAndAnotherClientIsUnaffected() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(2))) { test, client in
            for _ in 0..<2 {
                #expect(try await client.postToken(Self.junkCodeGrant(client: "com.example.app")).status == .badRequest)
            }
            let refused = try await client.postToken(Self.junkCodeGrant(client: "com.example.app"))
            #expect(refused.status == .tooManyRequests)
            #expect(json(refused)["error"] as? String == "temporarily_unavailable")
            #expect((json(refused)["error_description"] as? String)?.hasPrefix("Too many requests; retry after") == true)
            #expect(refused.headers[.cacheControl] == "no-store")
            #expect((Self.retryAfter(refused) ?? 0) >= 1)
            // Another app has its own bucket.
            #expect(try await client.postToken(Self.junkCodeGrant(client: "com.example.other")).status == .badRequest)
        }
    }

    @Test func revokeOverTheClientLimitIsOAuthJSON() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(1))) { test, client in
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let form = FormParameters(["token": "some-token", "client_id": "com.example.app"]).encoded()
            #expect(try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers, body: ByteBuffer(string: form)).status == .ok)
            let refused = try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers, body: ByteBuffer(string: form))
            #expect(refused.status == .tooManyRequests)
            #expect(refused.headers[.contentType] == "application/json")
            #expect(json(refused)["error"] as? String == "temporarily_unavailable")
            #expect(Self.retryAfter(refused) != nil)
        }
    }

    @Test func authorizeOverTheClientLimitShowsTheErrorPageWithRetryAfter() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(1))) { test, client in
            var headers = HTTPFields()
            headers[.accept] = "text/html,application/xhtml+xml"
            let first = try await client.execute(uri: TestGatehouse.authorizeURI(), method: .get, headers: headers)
            #expect(first.status == .found)
            let refused = try await client.execute(uri: TestGatehouse.authorizeURI(), method: .get, headers: headers)
            #expect(refused.status == .tooManyRequests)
            #expect(refused.headers[.contentType]?.hasPrefix("text/html") == true)
            #expect(String(buffer: refused.body).contains("Too Many Requests"))
            #expect((Self.retryAfter(refused) ?? 0) >= 1)
            // An API client asking the same gets the problem document.
            let api = try await client.execute(uri: TestGatehouse.authorizeURI(), method: .get)
            #expect(api.headers[.contentType] == "application/problem+json")
            #expect(json(api)["type"] as? String == "urn:gatehouse:problem:rate_limited")
        }
    }

    @Test func unknownClientIDsAreNeverCounted() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(1))) { test, client in
            for _ in 0..<3 {
                let response = try await client.postToken(Self.junkCodeGrant(client: "com.example.nobody"))
                #expect(response.status == .unauthorized)
                #expect(json(response)["error"] as? String == "invalid_client")
            }
        }
    }

    @Test func theBodyReadForTheClientLimitStillReachesTheRoute() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(10))) { test, client in
            let code = try await client.completeCallback(state: try await client.beginSignIn())
            let response = try await client.postToken(CallbackAndTokenTests.codeGrant(code))
            #expect(response.status == .ok)
            #expect(json(response)["access_token"] as? String == "upstream-at")
        }
    }

    @Test func aBodyOverTheLimitIs413AsTheRouteWouldSay() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerClient: Self.slow(10))) { test, client in
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let limit = test.gatehouse.configuration.server.maximumBodyBytes
            let body = "client_id=com.example.app&pad=" + String(repeating: "a", count: limit)
            let response = try await client.execute(uri: "/oauth/token", method: .post, headers: headers, body: ByteBuffer(string: body))
            #expect(response.status == .contentTooLarge)
        }
    }

    @Test func anUpstreamAskingToWaitIs503WithItsRetryAfter() async throws {
        try await Self.withGatehouse { test, client in
            // The upstream answered 429 (its wait: 42 s), and refreshes are refused until then.
            test.upstream.answer(with: .failure(OAuthError.upstreamUnavailable("HTTP 429", retryAfter: 42).delivered(.unspent)))
            let refresh = try await client.postToken(["grant_type": "refresh_token", "refresh_token": "upstream-rt", "client_id": "com.example.app"])
            #expect(refresh.status == .serviceUnavailable)
            #expect(json(refresh)["error"] as? String == "temporarily_unavailable")
            #expect(refresh.headers[.retryAfter] == "42")
            // A code exchange refused by the backoff (nothing sent): the same answer.
            test.upstream.answer(with: .failure(OAuthError.upstreamUnavailable("backing off", retryAfter: 17)))
            let state = try await client.beginSignIn(client: "com.example.relay", redirect: "com.example.relay:/cb")
            var form = CallbackAndTokenTests.codeGrant("upstream-code", client: "com.example.relay", redirect: "com.example.relay:/cb")
            form["state"] = state
            let exchange = try await client.postToken(form)
            #expect(exchange.status == .serviceUnavailable)
            #expect(json(exchange)["error"] as? String == "temporarily_unavailable")
            #expect(exchange.headers[.retryAfter] == "17")
        }
    }

    // MARK: /oauth/* per address, and trusted proxies

    @Test func addressOverItsLimitGets429WithRetryAfter() async throws {
        try await Self.withGatehouse(limits: RateLimitSettings(oauthPerAddress: Self.slow(2)), mode: .live) { test, client in
            for _ in 0..<2 {
                #expect(try await client.postToken(Self.junkCodeGrant(client: "com.example.app")).status == .badRequest)
            }
            // Whatever the client: the address is over.
            let refused = try await client.postToken(Self.junkCodeGrant(client: "com.example.other"))
            #expect(refused.status == .tooManyRequests)
            #expect(json(refused)["error"] as? String == "temporarily_unavailable")
            #expect((Self.retryAfter(refused) ?? 0) >= 1)
            // Only /oauth/* is limited.
            #expect(try await client.execute(uri: "/healthz", method: .get).status == .ok)
        }
    }

    /// The statuses of token requests sent one after the other, each with its `X-Forwarded-For`.
    static func statuses(_ client: any TestClientProtocol, forwardedFor values: [String]) async throws -> [HTTPResponse.Status] {
        var statuses: [HTTPResponse.Status] = []
        for value in values {
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            headers[try #require(HTTPField.Name("X-Forwarded-For"))] = value
            let response = try await client.execute(uri: "/oauth/token", method: .post, headers: headers,
                                                    body: ByteBuffer(string: FormParameters(junkCodeGrant(client: "com.example.app")).encoded()))
            statuses.append(response.status)
        }
        return statuses
    }

    @Test func behindATrustedProxyEachForwardedClientHasItsOwnBucket() async throws {
        let proxy = try #require(AddressRange("127.0.0.1"))
        let limits = RateLimitSettings(trustedProxies: [proxy], oauthPerAddress: Self.slow(1))
        try await Self.withGatehouse(limits: limits, mode: .live) { test, client in
            let statuses = try await Self.statuses(client, forwardedFor: ["198.51.100.7", "198.51.100.7", "198.51.100.8",
                                                                          "203.0.113.1, 198.51.100.7"])
            // The right-most address not a trusted proxy is the client: a spoofed left-most one changes nothing.
            #expect(statuses == [.badRequest, .tooManyRequests, .badRequest, .tooManyRequests])
        }
    }

    @Test func forwardedForFromAnUntrustedPeerIsIgnored() async throws {
        let proxies = try #require(AddressRange("10.0.0.0/8"))
        let limits = RateLimitSettings(trustedProxies: [proxies], oauthPerAddress: Self.slow(1))
        try await Self.withGatehouse(limits: limits, mode: .live) { test, client in
            // The peer (127.0.0.1) is the client: a new X-Forwarded-For does not buy a new bucket.
            let statuses = try await Self.statuses(client, forwardedFor: ["198.51.100.7", "198.51.100.8"])
            #expect(statuses == [.badRequest, .tooManyRequests])
        }
    }

    // MARK: the relay

    static func relayed(_ client: any TestClientProtocol, token: String) async throws -> TestResponse {
        var headers = HTTPFields()
        headers[.authorization] = "Bearer " + token
        return try await client.execute(uri: "/api/items", method: .get, headers: headers)
    }

    @Test func subjectOverTheRelayLimitGets429ProblemAndAnotherSubjectIsUnaffected() async throws {
        let resolver = NamingResolver(.bySubject)
        try await Self.withGatehouse(limits: RateLimitSettings(relayPerSubject: Self.slow(2)), resolver: resolver) { test, client in
            for _ in 0..<2 {
                #expect(Self.reachedTheBackend(try await Self.relayed(client, token: "alice-token")))
            }
            let refused = try await Self.relayed(client, token: "alice-token")
            #expect(refused.status == .tooManyRequests)
            #expect(refused.headers[.contentType] == "application/problem+json")
            #expect(json(refused)["type"] as? String == "urn:gatehouse:problem:rate_limited")
            #expect(json(refused)["title"] as? String == "Too Many Requests")
            #expect((Self.retryAfter(refused) ?? 0) >= 1)
            // Another token of the same subject shares the bucket; another subject does not.
            #expect(try await Self.relayed(client, token: "alice").status == .tooManyRequests)
            #expect(Self.reachedTheBackend(try await Self.relayed(client, token: "bob-token")))
        }
    }

    @Test func identityLookupsOverTheAddressLimitGet429WithoutAnIdentityCall() async throws {
        let resolver = NamingResolver(.inactive)
        let limits = RateLimitSettings(identityLookupsPerAddress: Self.slow(2))
        try await Self.withGatehouse(limits: limits, resolver: resolver, mode: .live) { test, client in
            #expect(try await Self.relayed(client, token: "junk-1").status == .unauthorized)
            #expect(try await Self.relayed(client, token: "junk-2").status == .unauthorized)
            let refused = try await Self.relayed(client, token: "junk-3")
            #expect(refused.status == .tooManyRequests)
            #expect(json(refused)["type"] as? String == "urn:gatehouse:problem:rate_limited")
            #expect((Self.retryAfter(refused) ?? 0) >= 1)
            #expect(resolver.calls.load(ordering: .relaxed) == 2)
            // A token already answered (cached, here as inactive) costs no look-up: not limited.
            #expect(try await Self.relayed(client, token: "junk-1").status == .unauthorized)
            #expect(resolver.calls.load(ordering: .relaxed) == 2)
        }
    }

    @Test func identityServiceAtItsConcurrencyLimitIs503RetryAfterOne() async throws {
        try await Self.withGatehouse(resolver: NamingResolver(.overloaded)) { test, client in
            let response = try await Self.relayed(client, token: "alice-token")
            #expect(response.status == .serviceUnavailable)
            #expect(response.headers[.contentType] == "application/problem+json")
            #expect(response.headers[.retryAfter] == "1")
            #expect(json(response)["code"] as? String == "identity_unavailable")
        }
    }

    // MARK: the fast path declines what the general path refuses

    @Test func thePlannerDeclinesOverTheSubjectLimitAndWhileTracing() async throws {
        let base = try await TestGatehouse.make()
        var configuration = base.gatehouse.configuration
        configuration.routes = [RouteSettings(prefix: "/api", backend: "http://backend.test/b", upstream: "legacy")]
        configuration.upstreams["legacy"]?.identity = IdentitySettings(kind: .introspection, url: "https://as.example.com/introspect")
        let relay = RelayServices(configuration: configuration, cache: IdentityCache(maximumEntries: 10),
                                  resolvers: ["legacy": NamingResolver(.bySubject)], backendClient: HTTPClient.shared, signer: nil)
        let alice = CallerIdentity(subject: "alice", bpid: nil, scopes: ["read"], attributes: [:], expiresAt: nil)
        relay.cache.insert(.active(alice), forToken: "alice-token", upstream: "legacy", ttl: .seconds(60))
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/api/items",
                                   headers: ["Host": "gatehouse.test", "Authorization": "Bearer alice-token"])
        let limits = RateLimiters(RateLimitSettings(relayPerSubject: Self.slow(1)))
        let planner = FastRelayPlanner(configuration: configuration, relay: relay, sessions: nil, limits: limits, logger: base.gatehouse.logger)
        #expect(planner.plan(head, remoteAddress: "127.0.0.1") != nil)
        #expect(planner.plan(head, remoteAddress: "127.0.0.1") == nil)

        let tracing = FastRelayPlanner(configuration: configuration, relay: relay, sessions: nil, tracingEnabled: true, logger: base.gatehouse.logger)
        #expect(tracing.plan(head, remoteAddress: "127.0.0.1") == nil)
        let plain = FastRelayPlanner(configuration: configuration, relay: relay, sessions: nil, logger: base.gatehouse.logger)
        #expect(plain.plan(head, remoteAddress: "127.0.0.1") != nil)
        try await base.store.close()
    }

    /// Bodies: Content-Length up to 64 KiB (and the route's limit) on methods that carry one;
    /// a body on GET, HEAD or OPTIONS, a chunked or larger one, or `Expect` goes the general way.
    @Test(arguments: [
        ("POST", ["Content-Length": "2048"], true), ("PUT", ["Content-Length": "65536"], true),
        ("POST", ["Content-Length": "0"], true), ("DELETE", ["Content-Length": "10"], true),
        ("POST", ["Content-Length": "65537"], false), ("POST", ["Transfer-Encoding": "chunked"], false),
        ("GET", ["Content-Length": "10"], false), ("HEAD", ["Content-Length": "10"], false), ("OPTIONS", ["Content-Length": "10"], false),
        ("POST", ["Content-Length": "10", "Expect": "100-continue"], false),
    ])
    func thePlannerTakesSmallBodiesOnly(method: String, extra: [String: String], fast: Bool) async throws {
        let base = try await TestGatehouse.make()
        var configuration = base.gatehouse.configuration
        configuration.routes = [RouteSettings(prefix: "/api", backend: "http://backend.test/b", methods: ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"],
                                              upstream: "legacy")]
        configuration.upstreams["legacy"]?.identity = IdentitySettings(kind: .introspection, url: "https://as.example.com/introspect")
        let relay = RelayServices(configuration: configuration, cache: IdentityCache(maximumEntries: 10),
                                  resolvers: ["legacy": NamingResolver(.bySubject)], backendClient: HTTPClient.shared, signer: nil)
        let alice = CallerIdentity(subject: "alice", bpid: nil, scopes: ["read"], attributes: [:], expiresAt: nil)
        relay.cache.insert(.active(alice), forToken: "alice-token", upstream: "legacy", ttl: .seconds(60))
        var headers: HTTPHeaders = ["Host": "gatehouse.test", "Authorization": "Bearer alice-token"]
        for (name, value) in extra { headers.add(name: name, value: value) }
        let head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: method), uri: "/api/items", headers: headers)
        let planner = FastRelayPlanner(configuration: configuration, relay: relay, sessions: nil, logger: base.gatehouse.logger)
        let plan = planner.plan(head, remoteAddress: "127.0.0.1")
        #expect((plan != nil) == fast)
        if let plan, method == "POST" || method == "PUT" {
            // NIO would frame a POST without a length as chunked: the length is always sent.
            #expect(plan.head.headers["content-length"] == [extra["Content-Length"] ?? "0"])
        }
        try await base.store.close()
    }
}
