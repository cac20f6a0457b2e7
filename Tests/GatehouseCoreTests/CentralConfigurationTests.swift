import Foundation
@testable import GatehouseCore
import GatehouseUpstreams
import Testing

/// The `central` kind's settings: defaults per environment, its keys read and checked at load,
/// and the rules its apps must follow.
struct CentralConfigurationTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/central").path

    static func s(_ text: String) -> ConfigNode { .scalar(text, line: 0) }
    static func m(_ entries: [(String, ConfigNode)]) -> ConfigNode { .mapping(entries.map { (key: $0.0, value: $0.1) }, line: 0) }
    static func list(_ items: [String]) -> ConfigNode { .sequence(items.map(s), line: 0) }

    static func document(upstream: [(String, ConfigNode)] = [], client: [(String, ConfigNode)] = [],
                         dropping: Set<String> = []) -> ConfigNode {
        let base: [(String, ConfigNode)] = [
            ("name", s("tasquito")), ("kind", s("central")), ("client_id", s("tasquito")),
            ("s2s_private_key_file", s(fixtures + "/app-private.pem")),
            ("api_base", s("https://www.broccoliapps.com/api/")), ("web_base", s("https://www.broccoliapps.com")),
            ("signing_key_files", list([fixtures + "/jwt-a.pem"])),
        ]
        return m([
            ("server", m([("public_base_url", s("https://gatehouse.example.com"))])),
            ("store", m([("sqlite_path", s("/tmp/g.sqlite"))])),
            ("sessions", m([("encryption_keys_file", s(fixtures + "/session-keys"))])),
            ("upstreams", .sequence([m(base.filter { !dropping.contains($0.0) } + upstream)], line: 0)),
            ("clients", .sequence([m([
                ("client_id", s("tasquito-app")), ("upstream", s("tasquito")), ("redirect_uris", list(["com.broccoliapps.tasquito:/oauth2redirect"])),
            ] + client)], line: 0)),
        ])
    }

    static let secrets = GatehouseConfiguration.SecretLookup(
        environment: { _ in nil },
        readFile: { _ in "v1 " + String(repeating: "A", count: 43) + "\n" })

    static func problems(_ document: ConfigNode) -> [String] {
        ConfigurationTests.problems(document, secrets: secrets)
    }

    @Test func productionDefaultsAreTheSeeds() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(), secrets: Self.secrets)
        let upstream = try #require(configuration.upstreams["tasquito"])
        let central = try #require(upstream.profile as? CentralSettings)
        #expect(central.apiBase == "https://www.broccoliapps.com/api")
        #expect(central.accessTokenLifetime == .seconds(86400))
        #expect(central.refreshTokenLifetime == .seconds(365 * 86400))
        #expect(central.rotation == .everyUse)
        #expect(central.provider == .google)
        #expect(central.magicLinkLimit == 5)
        #expect(central.magicLinkAddressLimit == 20)
        #expect(central.tokenKeys.issuer == "tasquito")
        #expect(upstream.identity?.kind == .gatehouse)
        #expect(upstream.identity?.attributePaths["email"] == "/data/email")
    }

    /// The kind's attributes are the default of `identity: {kind: gatehouse}`; an explicit
    /// `attributes` mapping, even an empty one, is the operator's choice and is kept.
    @Test func gatehouseIdentityTakesTheKindsAttributesUnlessTheConfigurationNamesItsOwn() throws {
        let named = try GatehouseConfiguration.decode(Self.document(upstream: [("identity", Self.m([("kind", Self.s("gatehouse"))]))]),
                                                      secrets: Self.secrets)
        #expect(named.upstreams["tasquito"]?.identity?.attributePaths["email"] == "/data/email")
        let none = try GatehouseConfiguration.decode(Self.document(upstream: [("identity", Self.m([
            ("kind", Self.s("gatehouse")), ("attributes", Self.m([])),
        ]))]), secrets: Self.secrets)
        #expect(none.upstreams["tasquito"]?.identity?.attributePaths.isEmpty == true)
        let own = try GatehouseConfiguration.decode(Self.document(upstream: [("identity", Self.m([
            ("kind", Self.s("gatehouse")), ("attributes", Self.m([("mail", Self.s("/data/email"))])),
        ]))]), secrets: Self.secrets)
        #expect(own.upstreams["tasquito"]?.identity?.attributePaths == ["mail": "/data/email"])
    }

    @Test func anAPIBaseWhosePathCannotBeSignedAsWrittenIsRefused() {
        for base in ["https://www.broccoliapps.com/api?x=1", "https://www.broccoliapps.com/a%70i", "https://www.broccoliapps.com/ap i",
                     "https://www.broccoliapps.com//api"] {
            let problems = Self.problems(Self.document(upstream: [("api_base", Self.s(base))], dropping: ["api_base"]))
            #expect(problems.contains { $0.hasPrefix("upstreams[0].api_base:") }, "\(base): \(problems)")
        }
    }

    @Test func appleNoncesAreRequiredUnlessTurnedOff() throws {
        func apple(_ extra: [(String, ConfigNode)]) throws -> CentralSettings.Apple? {
            let section = Self.m([("bundle_id", Self.s("com.broccoliapps.tasquito"))] + extra)
            let configuration = try GatehouseConfiguration.decode(Self.document(upstream: [("apple", section)]), secrets: Self.secrets)
            return (configuration.upstreams["tasquito"]?.profile as? CentralSettings)?.apple
        }
        #expect(try apple([])?.requireNonce == true)
        #expect(try apple([("require_nonce", Self.s("false"))])?.requireNonce == false)
        let problems = Self.problems(Self.document(upstream: [("apple", Self.m([("bundle_id", Self.s("b")), ("require_nonce", Self.s("maybe"))]))]))
        #expect(problems.contains("upstreams[0].apple.require_nonce: must be true or false"), "\(problems)")
    }

    @Test func developmentIsFiveMinutesAndAnHour() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(upstream: [("environment", Self.s("development"))]),
                                                              secrets: Self.secrets)
        let central = try #require(configuration.upstreams["tasquito"]?.profile as? CentralSettings)
        #expect(central.accessTokenLifetime == .seconds(300))
        #expect(central.refreshTokenLifetime == .seconds(3600))
    }

    @Test func aClientSecretIsRefusedAndTheKeysAreRequired() {
        let problems = Self.problems(Self.document(upstream: [("client_secret_env", Self.s("X"))],
                                                   dropping: ["s2s_private_key_file", "signing_key_files", "api_base"]))
        #expect(problems.contains("upstreams[0].client_secret_env: a central upstream has no client secret"))
        #expect(problems.contains("upstreams[0].s2s_private_key_file: is required"))
        #expect(problems.contains("upstreams[0].signing_key_files: is required"))
        #expect(problems.contains("upstreams[0].api_base: is required"))
    }

    @Test func keysThatAreNotRSAPrivateKeysAreRefusedAtLoad() {
        let problems = Self.problems(Self.document(upstream: [], dropping: ["s2s_private_key_file", "signing_key_files"]).replacing(
            upstream: [("s2s_private_key_file", Self.s(Self.fixtures + "/app-public.pem")),
                       ("signing_key_files", Self.list([Self.fixtures + "/missing.pem"]))]))
        #expect(problems.contains { $0.hasPrefix("upstreams[0].s2s_private_key_file:") && $0.contains("not an RSA private key") })
        #expect(problems.contains { $0.hasPrefix("upstreams[0].signing_key_files:") && $0.contains("cannot read the file") })
    }

    @Test func itsAppsAreSealedAndInCallbackMode() {
        let problems = Self.problems(Self.document(client: [("token_exposure", Self.s("passthrough")), ("wiring", Self.s("relay"))]))
        #expect(problems.contains { $0.hasPrefix("clients[0].token_exposure: must be sealed") })
        #expect(problems.contains { $0.hasPrefix("clients[0].wiring: must be callback") })
    }

    @Test func theAppAPINamesAClientOfThisUpstream() throws {
        let problems = Self.problems(Self.document(upstream: [("app_api", Self.m([("client", Self.s("someone-else"))]))]))
        #expect(problems == ["upstreams[0].app_api.client: 'someone-else' names no client of this upstream in 'clients'"])
        let configuration = try GatehouseConfiguration.decode(
            Self.document(upstream: [("app_api", Self.m([("client", Self.s("tasquito-app"))]))]), secrets: Self.secrets)
        let central = try #require(configuration.upstreams["tasquito"]?.profile as? CentralSettings)
        #expect(central.appAPI?.path == "/auth")
    }

    @Test func theAppAPIPathIsOneUpstreamsAndNoRoutes() {
        let api = Self.m([("client", Self.s("tasquito-app")), ("path", Self.s("/api/auth"))])
        guard case .mapping(var top, let line) = Self.document(upstream: [("app_api", api)]),
              let index = top.firstIndex(where: { $0.key == "upstreams" }), case .sequence(let items, _) = top[index].value,
              case .mapping(let first, _) = items[0] else { Issue.record("unexpected document"); return }
        // A second central upstream serving the same path, and a route covering it.
        let second = first.map { $0.key == "name" ? (key: "name", value: Self.s("tasquito-2")) : $0 }
        top[index].value = .sequence([items[0], .mapping(second, line: 0)], line: 0)
        top.append((key: "routes", value: .sequence([Self.m([
            ("prefix", Self.s("/api")), ("backend", Self.s("https://backend.example.com")), ("upstream", Self.s("tasquito")),
        ])], line: 0)))
        let problems = Self.problems(.mapping(top, line: line))
        #expect(problems.contains("upstreams[1].app_api.path: '/api/auth' is served for the upstream 'tasquito' already"))
        #expect(problems.contains("upstreams[0].app_api.path: '/api/auth' overlaps the relayed route '/api'"))
        let bad = Self.problems(Self.document(upstream: [("app_api", Self.m([("client", Self.s("tasquito-app")), ("path", Self.s("/auth/:id"))]))]))
        #expect(bad.contains { $0.hasPrefix("upstreams[0].app_api.path: must be an absolute path of letters") })
    }

    @Test func gatehouseIdentityNeedsACentralUpstream() {
        let problems = ConfigurationTests.problems(ConfigurationTests.document(upstream: [("identity", Self.m([("kind", Self.s("gatehouse"))]))]))
        #expect(problems.contains { $0.hasPrefix("upstreams[0].identity.kind: 'gatehouse' needs an upstream whose tokens Gatehouse mints") })
    }
}

extension ConfigNode {
    /// The document with entries added to its first upstream (test helper).
    fileprivate func replacing(upstream entries: [(String, ConfigNode)]) -> ConfigNode {
        guard case .mapping(var top, let line) = self, let index = top.firstIndex(where: { $0.key == "upstreams" }),
              case .sequence(var items, let listLine) = top[index].value, case .mapping(let first, let mapLine) = items[0] else { return self }
        items[0] = .mapping(first + entries.map { (key: $0.0, value: $0.1) }, line: mapLine)
        top[index].value = .sequence(items, line: listLine)
        return .mapping(top, line: line)
    }
}
