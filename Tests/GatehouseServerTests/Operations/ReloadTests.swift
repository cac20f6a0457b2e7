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
    static func configuration(backendPath: String, methods: String, relayPerSubject: String = "{per_second: 10, burst: 20}") throws
        -> GatehouseConfiguration
    {
        let yaml = ForwardAuthConfigurationTests.yaml(forwardAuth: "", prefix: "/api")
            .replacingOccurrences(of: "https://esb.example.com/contracts", with: "http://127.0.0.1:9\(backendPath)\n    methods: [\(methods)]")
        return try ForwardAuthConfigurationTests.load(yaml + "\nrate_limits:\n  relay_per_subject: \(relayPerSubject)\n")
    }

    static var quiet: Logger {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        return logger
    }

    /// A holder of a Gatehouse of `first` (else the `/v1`, GET-only configuration) on a runtime of its own.
    static func withHolder(_ first: GatehouseConfiguration? = nil, _ body: (GatehouseHolder, GatehouseRuntime) async throws -> Void)
        async throws
    {
        let logger = quiet
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let first = try first ?? configuration(backendPath: "/v1", methods: "GET")
        let runtime = GatehouseRuntime(configuration: first, store: store, upstreams: [:], httpClient: .shared, logger: logger)
        // The caller is known: the fast path can plan its requests without asking anyone.
        runtime.identityCache.insert(.active(CallerIdentity(subject: "alice", bpid: nil, scopes: ["read"], attributes: [:], expiresAt: nil)),
                                     forToken: token, upstream: "ates", ttl: .seconds(300))
        let holder = GatehouseHolder(Gatehouse(configuration: first, runtime: runtime))
        do {
            try await body(holder, runtime)
        } catch {
            try await runtime.shutdown()
            try await store.close()
            throw error
        }
        try await runtime.shutdown()
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

    /// The same through the reloader, as SIGHUP runs it: the file read again, checked, and put in force.
    @Test func aReloadedFileIsServedByBothPathsFromTheNextRequest() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("reload-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let secret = directory.appendingPathComponent("secret")
        try "s".write(to: secret, atomically: true, encoding: .utf8)
        func file(backendPath: String, methods: String) -> String {
            ForwardAuthConfigurationTests.yaml(forwardAuth: "", prefix: "/api")
                .replacingOccurrences(of: "https://esb.example.com/contracts", with: "http://127.0.0.1:9\(backendPath)\n    methods: [\(methods)]")
                .replacingOccurrences(of: "client_secret_env: SECRET", with: "client_secret_file: \(secret.path)")
        }
        let path = directory.appendingPathComponent("gatehouse.yaml").path
        try file(backendPath: "/v1", methods: "GET").write(toFile: path, atomically: true, encoding: .utf8)
        let (first, source) = try YAMLConfigurationLoader.loadSource(path: path)
        try await Self.withHolder(first) { holder, runtime in
            let reloader = Reloader(holder: holder, source: source, logger: Self.quiet)
            #expect(Self.fastTarget(holder) == "/v1/x")
            try file(backendPath: "/v2", methods: "GET, POST").write(toFile: path, atomically: true, encoding: .utf8)
            await reloader.reload(from: path)
            #expect(Self.fastTarget(holder) == "/v2/x")
            #expect(try await Self.generalAnswer(holder, method: .post).0 != .methodNotAllowed)
            #expect(holder.current.runtime === runtime)
            // A file a reload refuses (the server section changed) leaves both paths as they were.
            try file(backendPath: "/v3", methods: "GET").replacingOccurrences(of: "https://gatehouse.example.com", with: "https://other.example.com")
                .write(toFile: path, atomically: true, encoding: .utf8)
            await reloader.reload(from: path)
            #expect(Self.fastTarget(holder) == "/v2/x")
            #expect(try await Self.generalAnswer(holder, method: .post).0 != .methodNotAllowed)
        }
    }

    @Test func whatOutlivesAConfigurationCarriesOver() async throws {
        try await Self.withHolder { holder, runtime in
            let before = holder.current
            holder.replace(with: Gatehouse(configuration: try Self.configuration(backendPath: "/v2", methods: "GET"), runtime: runtime))
            let after = holder.current
            #expect(after.runtime === before.runtime)
            #expect(before.relay != nil)
            #expect(after.relay?.cache === before.relay?.cache)
            #expect(after.relay?.backendClient === before.relay?.backendClient)
            #expect(after.dpop.replays === before.dpop.replays)
            // The same rate-limit settings: the same buckets, so a reload hands nobody a fresh burst.
            #expect(after.limits.relayPerSubject === before.limits.relayPerSubject)
            #expect(after.limits.relayPerSubject != nil)
            #expect(after.dpop.nonces.current(now: Date()) == before.dpop.nonces.current(now: Date()))
            #expect(after.authorizationServer.passthrough === before.authorizationServer.passthrough)
            // Other settings for a limit: a fresh limiter, with the new settings.
            let slower = try Self.configuration(backendPath: "/v2", methods: "GET", relayPerSubject: "{per_second: 1, burst: 2}")
            holder.replace(with: Gatehouse(configuration: slower, runtime: runtime))
            #expect(holder.current.limits.relayPerSubject !== before.limits.relayPerSubject)
            #expect(holder.current.limits.relayPerSubject?.settings.burst == 2)
        }
    }
}
