import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseServer
import GatehouseStore
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Testing

/// `forward_auth:` (docs/relay.md, "Behind your ingress"): read with its bounds, refused where it
/// cannot work, and its endpoint answers nobody outside `trusted_proxies`, reading nothing they sent.
struct ForwardAuthConfigurationTests {
    static func yaml(forwardAuth: String, routes: Bool = true, prefix: String = "/api/contracts") -> String {
        """
        server:
          public_base_url: https://gatehouse.example.com
        store:
          sqlite_path: ":memory:"
        upstreams:
          - name: ates
            kind: oauth2
            authorization_endpoint: https://login.example.com/authorize
            token_endpoint: https://login.example.com/token
            client_id: mobile-api
            client_secret_env: SECRET
            identity:
              kind: introspection
              url: https://login.example.com/introspect
        clients:
          - client_id: com.example.myapp
            upstream: ates
            token_exposure: passthrough
            redirect_uris: ["com.example.myapp:/cb"]
        \(routes ? """
        routes:
          - prefix: \(prefix)
            backend: https://esb.example.com/contracts
            upstream: ates
            identity_headers:
              X-BPId: bpid
        """ : "")
        \(forwardAuth)
        """
    }

    static func load(_ yaml: String) throws -> GatehouseConfiguration {
        try YAMLConfigurationLoader.load(yaml: yaml, baseDirectory: FileManager.default.temporaryDirectory, environment: ["SECRET": "s"])
    }

    static func problems(_ yaml: String) -> String {
        do {
            _ = try load(yaml)
            return ""
        } catch {
            return String(describing: error)
        }
    }

    @Test func theSectionIsReadWithItsDefaults() throws {
        let configuration = try Self.load(Self.yaml(forwardAuth: "forward_auth:\n  trusted_proxies: [10.0.0.0/8, \"fd00::/8\"]"))
        let settings = try #require(configuration.forwardAuth)
        #expect(settings.maxAge == .seconds(5))
        #expect(settings.trusts("10.1.2.3"))
        #expect(settings.trusts("fd00::1"))
        #expect(!settings.trusts("192.168.1.1"))
        #expect(!settings.trusts(nil))
        #expect(try Self.load(Self.yaml(forwardAuth: "")).forwardAuth == nil)
        let zero = try Self.load(Self.yaml(forwardAuth: "forward_auth:\n  trusted_proxies: [127.0.0.1]\n  max_age: 0s"))
        #expect(zero.forwardAuth?.maxAge == .zero)
    }

    @Test(arguments: [
        ("forward_auth:\n  max_age: 5s", "forward_auth.trusted_proxies"),
        ("forward_auth:\n  trusted_proxies: []", "forward_auth.trusted_proxies"),
        ("forward_auth:\n  trusted_proxies: [not-an-address]", "forward_auth.trusted_proxies"),
        ("forward_auth:\n  trusted_proxies: [127.0.0.1]\n  max_age: 10m", "forward_auth.max_age"),
        ("forward_auth:\n  trusted_proxies: [127.0.0.1]\n  cache: on", "forward_auth.cache"),
    ])
    func aSectionThatCannotWorkIsRefusedNamingTheKey(section: String, key: String) {
        #expect(Self.problems(Self.yaml(forwardAuth: section)).contains(key))
    }

    @Test func decisionsNeedRoutes() {
        #expect(Self.problems(Self.yaml(forwardAuth: "forward_auth:\n  trusted_proxies: [127.0.0.1]", routes: false)).contains("needs routes"))
    }

    @Test(arguments: ["/forward-auth", "/forward-auth/envoy", "/forward-auth/refusal/x"])
    func noRouteMayTakeTheEndpointsPath(prefix: String) {
        #expect(Self.problems(Self.yaml(forwardAuth: "", prefix: prefix)).contains("/forward-auth"))
    }

    static func withRouter(forwardAuth: String, _ body: @Sendable (any TestClientProtocol) async throws -> Void) async throws {
        let configuration = try Self.load(Self.yaml(forwardAuth: forwardAuth))
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let runtime = GatehouseRuntime(configuration: configuration, store: store, upstreams: [:], httpClient: .shared, logger: logger)
        let gatehouse = Gatehouse(configuration: configuration, runtime: runtime)
        do {
            try #require(gatehouse.relay != nil)
            try await Application(router: GatehouseApplication.router(for: gatehouse)).test(.router, body)
        } catch {
            try await runtime.shutdown()
            try await store.close()
            throw error
        }
        try await runtime.shutdown()
        try await store.close()
    }

    /// In-process requests have no peer address: like any address outside `trusted_proxies`, they
    /// are refused whatever they describe, and nothing they describe is looked at (no 400 for a
    /// malformed description, no route matched).
    @Test func aPeerOutsideTheTrustedProxiesIsRefusedUnread() async throws {
        try await Self.withRouter(forwardAuth: "forward_auth:\n  trusted_proxies: [127.0.0.1]") { client in
            for path in ["/forward-auth", "/forward-auth/envoy/api/contracts", "/forward-auth/refusal"] {
                var headers = HTTPFields()
                headers[HTTPField.Name("X-Original-URI")!] = "not a path"
                headers[HTTPField.Name("X-Gatehouse-Refusal")!] = "e30"
                let response = try await client.execute(uri: path, method: .get, headers: headers)
                #expect(response.status == .forbidden, "\(path)")
                #expect(String(buffer: response.body).contains("trusted_proxies"))
                #expect(response.headers[HTTPField.Name("X-Gatehouse-Refusal")!] == nil)
            }
        }
    }

    @Test func withoutTheSectionTheEndpointIsNotThere() async throws {
        try await Self.withRouter(forwardAuth: "") { client in
            var headers = HTTPFields()
            headers[HTTPField.Name("X-Original-URI")!] = "/api/contracts"
            headers[HTTPField.Name("X-Original-Method")!] = "GET"
            let response = try await client.execute(uri: "/forward-auth", method: .get, headers: headers)
            #expect(response.status == .notFound)
        }
    }
}
