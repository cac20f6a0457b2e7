import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseRelay
@testable import GatehouseServer
import GatehouseStore
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOHTTP1
import Testing

/// A reload (SIGHUP) builds a new `Gatehouse` on the runtime in force and puts it and its fast
/// path's planner in force in one step: from the request after the swap on, both paths serve the
/// new configuration, and what outlives a configuration (the identity cache, the token buckets,
/// DPoP's replay cache) carries over.
struct ReloadTests {
    static let token = "reload-test-token"

    /// A configuration whose one route sends `/api` to `backendPath` of an unreachable backend,
    /// for the `methods` given.
    static func configuration(backendPath: String, methods: String) throws -> GatehouseConfiguration {
        let yaml = ForwardAuthConfigurationTests.yaml(forwardAuth: "", prefix: "/api")
            .replacingOccurrences(of: "https://esb.example.com/contracts", with: "http://127.0.0.1:9\(backendPath)\n    methods: [\(methods)]")
        return try ForwardAuthConfigurationTests.load(yaml + "\nrate_limits:\n  relay_per_subject: {per_second: 10, burst: 20}\n")
    }

    static func withHolder(_ body: (GatehouseHolder, GatehouseRuntime) async throws -> Void) async throws {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let first = try configuration(backendPath: "/v1", methods: "GET")
        let runtime = GatehouseRuntime(configuration: first, store: store, upstreams: [:], httpClient: .shared, logger: logger)
        // The caller is known: the fast path can plan its requests without asking anyone.
        runtime.identityCache.insert(.active(CallerIdentity(subject: "alice", bpid: nil, scopes: ["read"], attributes: [:], expiresAt: nil)),
                                     forToken: token, upstream: "ates", ttl: .seconds(300))
        let holder = GatehouseHolder(Gatehouse(configuration: first, runtime: runtime))
        do {
            try await body(holder, runtime)
        } catch {
            try await runtime.backendClient?.shutdown()
            try await store.close()
            throw error
        }
        try await runtime.backendClient?.shutdown()
        try await store.close()
    }

    /// The backend path the fast path would send `GET /api/x` to, or nil when it leaves it to the general path.
    static func fastTarget(_ holder: GatehouseHolder, method: HTTPMethod = .GET) -> String? {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: "/api/x")
        head.headers.add(name: "Host", value: "gatehouse.example.com")
        head.headers.add(name: "Authorization", value: "Bearer \(token)")
        var memo = ConnectionMemo()
        return holder.plan(head, remoteAddress: "127.0.0.1", memo: &memo)?.head.uri
    }

    /// What the general path answers `method /api/x` with.
    static func generalAnswer(_ holder: GatehouseHolder, method: HTTPRequest.Method) async throws -> (HTTPResponse.Status, String?) {
        try await Application(router: GatehouseApplication.router(holder: holder)).test(.router) { client in
            let response = try await client.execute(uri: "/api/x", method: method, headers: [.authorization: "Bearer \(token)"])
            return (response.status, response.headers[.allow])
        }
    }

    @Test func bothPathsServeTheNewConfigurationFromTheRequestAfterTheSwap() async throws {
        try await Self.withHolder { holder, runtime in
            #expect(Self.fastTarget(holder) == "/v1/x")
            #expect(try await Self.generalAnswer(holder, method: .post).0 == .methodNotAllowed)

            let second = try Self.configuration(backendPath: "/v2", methods: "GET, POST")
            holder.replace(with: Gatehouse(configuration: second, runtime: runtime))

            // The very next request on either path: the new backend path, the new methods.
            #expect(Self.fastTarget(holder) == "/v2/x")
            #expect(Self.fastTarget(holder, method: .POST) == "/v2/x")
            let general = try await Self.generalAnswer(holder, method: .post)
            #expect(general.0 != .methodNotAllowed, "the general path still refuses POST after the reload")
            #expect(holder.current.configuration.routes.first?.backend == "http://127.0.0.1:9/v2")
        }
    }

    @Test func whatOutlivesAConfigurationCarriesOver() async throws {
        try await Self.withHolder { holder, runtime in
            let before = holder.current
            holder.replace(with: Gatehouse(configuration: try Self.configuration(backendPath: "/v2", methods: "GET"), runtime: runtime))
            let after = holder.current
            #expect(after.runtime === before.runtime)
            #expect(after.relay?.cache === before.relay?.cache)
            #expect(after.relay?.backendClient === before.relay?.backendClient)
            #expect(after.dpop.replays === before.dpop.replays)
            // The same rate-limit settings: the same buckets, so a reload hands nobody a fresh burst.
            #expect(after.limits.relayPerSubject === before.limits.relayPerSubject)
            #expect(after.limits.relayPerSubject != nil)
        }
    }
}
