import GatehouseUpstreams
@testable import GatehouseCore
import Testing

struct ConfigurationTests {
    static let secrets = GatehouseConfiguration.SecretLookup(
        environment: { $0 == "LEGACY_SECRET" ? "s3cr3t-value" : nil },
        readFile: { _ in throw CancellationError() })

    static func scalar(_ text: String, _ line: Int = 0) -> ConfigNode { .scalar(text, line: line) }
    static func map(_ entries: [(String, ConfigNode)], _ line: Int = 0) -> ConfigNode {
        .mapping(entries.map { (key: $0.0, value: $0.1) }, line: line)
    }

    static func document(server: [(String, ConfigNode)] = [], upstream: [(String, ConfigNode)] = [],
                         client: [(String, ConfigNode)] = []) -> ConfigNode {
        map([
            ("server", map([("public_base_url", scalar("https://gatehouse.example.com"))] + server)),
            ("store", map([("sqlite_path", scalar("/tmp/g.sqlite"))])),
            ("upstreams", .sequence([map([
                ("name", scalar("legacy")),
                ("authorization_endpoint", scalar("https://as.example.com/authorize")),
                ("token_endpoint", scalar("https://as.example.com/token")),
                ("client_id", scalar("gatehouse")),
                ("client_secret_env", scalar("LEGACY_SECRET")),
            ] + upstream)], line: 0)),
            ("clients", .sequence([map([
                ("client_id", scalar("com.example.app")),
                ("upstream", scalar("legacy")),
                ("redirect_uris", .sequence([scalar("com.example.app:/cb")], line: 0)),
                ("token_exposure", scalar("passthrough")),
            ] + client)], line: 0)),
        ])
    }

    @Test func validDocumentDecodesWithDefaults() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(), secrets: Self.secrets)
        let upstream = try #require(configuration.upstreams["legacy"])
        #expect(upstream.clientSecret.reveal() == "s3cr3t-value")
        #expect(upstream.clientAuthentication == .clientSecretBasic)
        #expect(configuration.clients["com.example.app"]?.wiring == .callback)
        #expect(configuration.server.codeLifetime == .seconds(60))
    }

    @Test func everyProblemIsListedWithItsPath() {
        let document = Self.document(
            server: [("colour", Self.scalar("blue", 4)), ("code_lifetime", Self.scalar("5m", 5))],
            upstream: [("client_auth", Self.scalar("private_key", 9))],
            client: [("wiring", Self.scalar("sideways", 12))])
        do {
            _ = try GatehouseConfiguration.decode(document, secrets: Self.secrets)
            Issue.record("expected problems")
        } catch {
            let paths = Set(error.problems.map(\.path))
            #expect(paths == ["server.colour", "server.code_lifetime", "upstreams[0].client_auth", "clients[0].wiring"])
            #expect(error.problems.first { $0.path == "server.colour" }?.line == 4)
        }
    }

    @Test func inlineSecretIsRefusedAndNeverEchoed() {
        let document = Self.document(upstream: [("client_secret", Self.scalar("hunter2-inline"))])
        do {
            _ = try GatehouseConfiguration.decode(document, secrets: Self.secrets)
            Issue.record("expected a problem")
        } catch {
            #expect(error.problems.map(\.path) == ["upstreams[0].client_secret"])
            #expect(!error.description.contains("hunter2-inline"))
        }
    }

    @Test func missingEnvironmentSecretIsAProblem() {
        let secrets = GatehouseConfiguration.SecretLookup(environment: { _ in nil }, readFile: { _ in "" })
        #expect(throws: ConfigErrors.self) { try GatehouseConfiguration.decode(Self.document(), secrets: secrets) }
    }

    @Test func secretNeverPrints() {
        let secret = Secret("do-not-print")
        #expect("\(secret)" == "<redacted>")
        #expect(String(reflecting: secret) == "<redacted>")
    }

    @Test(arguments: [("500ms", Duration.milliseconds(500)), ("30s", .seconds(30)), ("10m", .seconds(600)), ("2", .seconds(2))])
    func durationsAreReadWithUnits(text: String, expected: Duration) {
        #expect(MappingReader.parseDuration(text) == expected)
    }
}

extension ConfigurationTests {
    @Test func clientOfAnUpstreamWithProblemsGetsNoSecondError() {
        let secrets = GatehouseConfiguration.SecretLookup(environment: { _ in nil }, readFile: { _ in "" })
        do {
            _ = try GatehouseConfiguration.decode(Self.document(), secrets: secrets)
            Issue.record("expected a problem")
        } catch {
            #expect(error.problems.map(\.path) == ["upstreams[0].client_secret_env"])
        }
    }
}

extension ConfigurationTests {
    @Test(arguments: [("127.0.0.1", PostgresSettings.PostgresTLS.disable), ("db.internal.example", .require)])
    func postgresTLSIsRequiredOffThisMachine(host: String, expected: PostgresSettings.PostgresTLS) throws {
        guard case .mapping(var entries, let line) = Self.document() else { return }
        entries[1] = (key: "store", value: Self.map([("postgres", Self.map([
            ("host", Self.scalar(host)), ("database", Self.scalar("gatehouse")), ("username", Self.scalar("gatehouse")),
        ]))]))
        let configuration = try GatehouseConfiguration.decode(.mapping(entries, line: line), secrets: Self.secrets)
        #expect(configuration.store.postgres?.tls == expected)
    }

    static func postgresDocument(_ settings: [(String, ConfigNode)]) -> ConfigNode {
        guard case .mapping(var entries, let line) = document() else { return document() }
        entries[1] = (key: "store", value: map([("postgres", map(settings + [
            ("database", scalar("gatehouse")), ("username", scalar("gatehouse")),
        ]))]))
        return .mapping(entries, line: line)
    }

    @Test func severalPostgresHostsAreTriedInOrder() throws {
        let hosts = ConfigNode.sequence(["10.0.0.1:5433", "db-b.internal", "[fd00::7]:6432"].map { Self.scalar($0) }, line: 0)
        let configuration = try GatehouseConfiguration.decode(Self.postgresDocument([("hosts", hosts)]), secrets: Self.secrets)
        let settings = try #require(configuration.store.postgres)
        #expect(settings.hosts == [PostgresEndpoint(host: "10.0.0.1", port: 5433), PostgresEndpoint(host: "db-b.internal", port: 5432),
                                   PostgresEndpoint(host: "fd00::7", port: 6432)])
        #expect(settings.hosts.map(\.description) == ["10.0.0.1:5433", "db-b.internal:5432", "[fd00::7]:6432"])
        #expect(settings.tls == .require)
        let loopback = ConfigNode.sequence(["127.0.0.1:5433", "localhost:5434"].map { Self.scalar($0) }, line: 0)
        #expect(try GatehouseConfiguration.decode(Self.postgresDocument([("hosts", loopback)]), secrets: Self.secrets).store.postgres?.tls == .disable)
    }

    @Test(arguments: [
        ([("hosts", ConfigNode.sequence([], line: 0))], "store.postgres.hosts"),
        ([("hosts", .sequence([.scalar("db:notaport", line: 0)], line: 0))], "store.postgres.hosts"),
        ([("hosts", .sequence([.scalar("db:70000", line: 0)], line: 0))], "store.postgres.hosts"),
        ([("hosts", .sequence([.scalar("fd00::7:5432", line: 0)], line: 0))], "store.postgres.hosts"),
        ([("hosts", .sequence([.scalar("db-a:5432", line: 0)], line: 0)), ("host", ConfigNode.scalar("db-b", line: 0))], "store.postgres.hosts"),
        ([("hosts", .sequence([.scalar("db-a:5432", line: 0)], line: 0)), ("port", ConfigNode.scalar("5433", line: 0))], "store.postgres.port"),
        ([], "store.postgres.host"),
    ])
    func postgresServersAreGivenOneWay(settings: [(String, ConfigNode)], path: String) {
        #expect(Self.problems(Self.postgresDocument(settings)).contains { $0.hasPrefix(path + ":") })
    }
}

/// Each kind reads its own settings (`UpstreamRegistry`); these check the presets and the problems.
extension ConfigurationTests {
    static func document(upstreamEntries: [(String, ConfigNode)]) -> ConfigNode {
        map([
            ("server", map([("public_base_url", scalar("https://gatehouse.example.com"))])),
            ("store", map([("sqlite_path", scalar("/tmp/g.sqlite"))])),
            ("upstreams", .sequence([map([("name", scalar("fc")), ("client_id", scalar("gatehouse")),
                                          ("client_secret_env", scalar("LEGACY_SECRET"))] + upstreamEntries)], line: 0)),
            ("clients", .sequence([map([
                ("client_id", scalar("com.example.app")), ("upstream", scalar("fc")), ("token_exposure", scalar("passthrough")),
                ("redirect_uris", .sequence([scalar("com.example.app:/cb")], line: 0)),
            ])], line: 0)),
        ])
    }

    static func problems(_ document: ConfigNode, secrets: GatehouseConfiguration.SecretLookup = secrets) -> [String] {
        do {
            _ = try GatehouseConfiguration.decode(document, secrets: secrets)
            return []
        } catch {
            return error.problems.map { "\($0.path): \($0.message)" }
        }
    }

    @Test func franceConnectV2IntegrationPreset() throws {
        let configuration = try GatehouseConfiguration.decode(
            Self.document(upstreamEntries: [("kind", Self.scalar("franceconnect")), ("platform", Self.scalar("integration"))]),
            secrets: Self.secrets)
        let upstream = try #require(configuration.upstreams["fc"])
        let oidc = try #require(upstream.profile as? OIDCSettings)
        #expect(oidc.issuer == "https://fcp-low.integ01.dev-franceconnect.fr/api/v2")
        #expect(oidc.endpoints == nil)  // discovery
        #expect(oidc.algorithm == .es256)
        #expect(oidc.acrValues == "eidas1")
        #expect(!oidc.refreshes)
        #expect(upstream.clientAuthentication == .clientSecretPost)
        #expect(upstream.scopes == ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry"])
        #expect(upstream.identity?.kind == .session)
    }

    @Test func franceConnectV1NamesTheOriginAsIssuerAndSignsWithTheSecret() throws {
        let configuration = try GatehouseConfiguration.decode(
            Self.document(upstreamEntries: [("kind", Self.scalar("franceconnect")), ("version", Self.scalar("v1"))]), secrets: Self.secrets)
        let oidc = try #require(configuration.upstreams["fc"]?.profile as? OIDCSettings)
        #expect(oidc.issuer == "https://app.franceconnect.gouv.fr")
        #expect(oidc.endpoints?.token == "https://app.franceconnect.gouv.fr/api/v1/token")
        #expect(oidc.endpoints?.endSession == "https://app.franceconnect.gouv.fr/api/v1/logout")
        #expect(oidc.algorithm == .hs256)
    }

    @Test func franceConnectV1RefusesAnAsymmetricAlgorithm() {
        let problems = Self.problems(Self.document(upstreamEntries: [
            ("kind", Self.scalar("franceconnect")), ("version", Self.scalar("v1")), ("id_token_signing_alg", Self.scalar("ES256")),
        ]))
        #expect(problems == ["upstreams[0].id_token_signing_alg: FranceConnect v1 signs ID tokens with HS256 only"])
    }

    @Test func oidcNeedsTheOpenIDScopeAndAnIssuer() {
        let problems = Self.problems(Self.document(upstreamEntries: [
            ("kind", Self.scalar("oidc")), ("scopes", .sequence([Self.scalar("profile")], line: 0)),
        ]))
        #expect(problems.contains("upstreams[0].issuer: is required"))
        #expect(problems.contains("upstreams[0].scopes: must include openid"))
    }

    @Test func anUnknownKindListsTheKnownOnes() {
        let problems = Self.problems(Self.document(upstreamEntries: [("kind", Self.scalar("saml"))]))
        #expect(problems.contains("upstreams[0].kind: must be one of: central, franceconnect, oauth2, oidc"))
    }

    @Test func sessionIdentityNeedsAnUpstreamThatVerifiesWhoSignedIn() {
        let problems = Self.problems(Self.document(upstream: [("identity", Self.map([("kind", Self.scalar("session"))]))]))
        #expect(problems.contains { $0.hasPrefix("upstreams[0].identity.kind: 'session' needs an upstream") })
    }

    @Test func aKindsOwnKeyIsUnknownToAnotherKind() {
        let problems = Self.problems(Self.document(upstream: [("acr_values", Self.scalar("eidas1"))]))
        #expect(problems == ["upstreams[0].acr_values: is not a known setting"])
    }
}
