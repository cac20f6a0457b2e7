import Foundation
import GatehouseUpstreams
@testable import GatehouseCore
import Testing

/// `clients[].instances`, `clients[].dpop`, `mail`, `webviews`, `dpop` and `accept_session_cookie`.
struct InstanceConfigurationTests {
    typealias C = ConfigurationTests

    /// A sealed callback app (with `sessions`) plus `client` entries and top-level `extra` sections.
    static func document(client: [(String, ConfigNode)] = [], extra: [(String, ConfigNode)] = [],
                         route: [(String, ConfigNode)]? = nil) -> ConfigNode {
        guard case .mapping(var top, let line) = C.document(
            upstream: [("identity", C.map([("kind", C.scalar("introspection")), ("url", C.scalar("https://as.example.com/introspect"))]))],
            client: [("token_exposure", C.scalar("sealed"))] + client)
        else { return C.document() }
        // A key given again overrides the base document's (its client is passthrough: this one is sealed).
        top = top.map { entry in
            guard entry.key == "clients", case .sequence(let items, let l) = entry.value, case .mapping(let fields, let ml)? = items.first
            else { return entry }
            let kept = fields.enumerated().filter { index, field in !fields[(index + 1)...].contains { $0.key == field.key } }.map(\.element)
            return (key: "clients", value: .sequence([.mapping(kept, line: ml)], line: l))
        }
        top.append((key: "sessions", value: C.map([("encryption_keys_file", C.scalar("keys.txt"))])))
        if let route {
            top.append((key: "routes", value: .sequence([C.map([("prefix", C.scalar("/web")), ("backend", C.scalar("http://127.0.0.1:9/web")),
                                                                ("upstream", C.scalar("legacy"))] + route)], line: 0)))
        }
        top += extra.map { (key: $0.0, value: $0.1) }
        return .mapping(top, line: line)
    }

    static let files = GatehouseConfiguration.SecretLookup(environment: C.secrets.environment) { path in
        switch path {
        case "keys.txt": return "k1 " + Base64URL.encode([UInt8](repeating: 7, count: 32)) + "\n"
        case "dec.txt": return Data(repeating: 1, count: 32).base64EncodedString() + "\n"
        case "ver.txt": return Data(repeating: 2, count: 91).base64EncodedString()
        case "short.txt": return Data(repeating: 1, count: 16).base64EncodedString()
        case "root.pem": return "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
        default: throw CancellationError()
        }
    }

    static func problems(_ document: ConfigNode) -> [String: String] {
        do {
            _ = try GatehouseConfiguration.decode(document, secrets: files)
            return [:]
        } catch {
            return Dictionary(error.problems.map { ($0.path, $0.message) }, uniquingKeysWith: { $0 + " | " + $1 })
        }
    }

    @Test func instancesDecodeWithTheirDefaults() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(client: [("instances", C.map([]))]), secrets: Self.files)
        let client = try #require(configuration.clients["com.example.app"])
        let instances = try #require(client.instances)
        #expect(instances.unusedLifetime == .seconds(90 * 86400))
        #expect(instances.attestation == .off)
        #expect(client.dpop == .optional)
        #expect(configuration.dpop.proofLifetime == .seconds(60))
        #expect(configuration.mail == nil && configuration.webviews == nil)
    }

    @Test func appleAndPlayAreReadFromTheirFiles() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(client: [
            ("dpop", C.scalar("required")),
            ("instances", C.map([
                ("attestation", C.scalar("required")), ("unused_lifetime", C.scalar("30d")),
                ("apple", C.map([("app_id", C.scalar("ABCDE12345.com.example.app")), ("environment", C.scalar("development")),
                                 ("root_ca_file", C.scalar("root.pem"))])),
                ("play", C.map([("package_name", C.scalar("com.example.app")), ("decryption_key_file", C.scalar("dec.txt")),
                                ("verification_key_file", C.scalar("ver.txt")), ("device_recognition", C.scalar("MEETS_STRONG_INTEGRITY"))])),
            ])),
        ]), secrets: Self.files)
        let client = try #require(configuration.clients["com.example.app"])
        #expect(client.dpop == .required)
        let instances = try #require(client.instances)
        #expect(instances.attestation == .required && instances.unusedLifetime == .seconds(30 * 86400))
        #expect(instances.apple?.appID == "ABCDE12345.com.example.app" && instances.apple?.development == true)
        #expect(instances.apple?.rootCertificatesPEM?.hasPrefix("-----BEGIN CERTIFICATE-----") == true)
        #expect(instances.play?.requiredDeviceVerdict == "MEETS_STRONG_INTEGRITY")
        #expect(instances.play?.decryptionKey.reveal() == Data(repeating: 1, count: 32).base64EncodedString())
        #expect("\(instances.play!.decryptionKey)" == "<redacted>")
    }

    @Test func wrongInstanceSettingsAreProblemsWithTheirPaths() {
        let found = Self.problems(Self.document(client: [
            ("client_id", C.scalar("com.example~app")),
            ("instances", C.map([
                ("attestation", C.scalar("required")), ("manual_certification", C.scalar("true")),
                ("apple", C.map([("app_id", C.scalar("com.example.app"))])),
                ("play", C.map([("package_name", C.scalar("com.example.app")), ("decryption_key_file", C.scalar("short.txt")),
                                ("verification_key_file", C.scalar("missing.txt")), ("device_recognition", C.scalar("MEETS_ALL"))])),
            ])),
        ]))
        #expect(found["clients[0].client_id"]?.contains("~") == true)
        #expect(found["clients[0].instances.apple.app_id"] != nil)
        #expect(found["clients[0].instances.play.decryption_key_file"]?.contains("32-byte") == true)
        #expect(found["clients[0].instances.play.verification_key_file"]?.contains("cannot read") == true)
        #expect(found["clients[0].instances.play.device_recognition"] != nil)
        // Manual certification e-mails a code: it needs the mail section.
        #expect(found["mail"] != nil)
    }

    @Test func attestationNeedsAWayToCertifyAndManualNeedsRequired() {
        let none = Self.problems(Self.document(client: [("instances", C.map([("attestation", C.scalar("preferred"))]))]))
        #expect(none["clients[0].instances.attestation"]?.contains("apple, play or manual_certification") == true)
        let manual = Self.problems(Self.document(client: [("instances", C.map([
            ("attestation", C.scalar("preferred")), ("manual_certification", C.scalar("true")),
        ]))], extra: [("mail", C.map([("smtp_host", C.scalar("127.0.0.1")), ("from", C.scalar("gh@example.com"))]))]))
        #expect(manual["clients[0].instances.manual_certification"]?.contains("attestation: required") == true)
    }

    @Test func manualCertificationNeedsTheCallbackWiring() {
        let found = Self.problems(Self.document(client: [("wiring", C.scalar("relay")), ("instances", C.map([
            ("attestation", C.scalar("required")), ("manual_certification", C.scalar("true")),
        ]))], extra: [("mail", C.map([("smtp_host", C.scalar("127.0.0.1")), ("from", C.scalar("gh@example.com"))]))]))
        #expect(found["clients[0].instances.manual_certification"]?.contains("wiring: callback") == true)
    }

    @Test func mailRefusesClearTextOffLoopbackAndInlinePasswords() throws {
        let found = Self.problems(Self.document(extra: [("mail", C.map([
            ("smtp_host", C.scalar("smtp.example.com")), ("starttls", C.scalar("false")), ("password", C.scalar("hunter2")),
            ("from", C.scalar("not an address")),
        ]))]))
        #expect(found["mail.starttls"]?.contains("loopback") == true)
        #expect(found["mail.password"] != nil)
        #expect(found.values.allSatisfy { !$0.contains("hunter2") })
        #expect(found["mail.from"] != nil)
        let configuration = try GatehouseConfiguration.decode(Self.document(extra: [("mail", C.map([
            ("smtp_host", C.scalar("127.0.0.1")), ("smtp_port", C.scalar("2525")), ("from", C.scalar("gatehouse@example.com")),
        ]))]), secrets: Self.files)
        #expect(configuration.mail?.port == 2525 && configuration.mail?.startTLS == true && configuration.mail?.from == "gatehouse@example.com")
    }

    @Test func webviewOriginsAreCanonicalAndCookieRoutesNeedThem() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(
            extra: [("webviews", C.map([("origins", .sequence([C.scalar("HTTPS://App.Example.com:443"), C.scalar("http://127.0.0.1:8000")], line: 0))]))],
            route: [("accept_session_cookie", C.scalar("true"))]), secrets: Self.files)
        #expect(configuration.webviews?.origins == ["https://app.example.com", "http://127.0.0.1:8000"])
        #expect(configuration.routes.first?.acceptSessionCookie == true)
        let found = Self.problems(Self.document(route: [("accept_session_cookie", C.scalar("true"))]))
        #expect(found["routes"]?.contains("webviews") == true)
        for bad in ["http://app.example.com", "https://app.example.com/path", "https://user@app.example.com", "app.example.com"] {
            #expect(GatehouseConfiguration.webOrigin(bad) == nil, "\(bad)")
        }
    }

    @Test func dpopIsOffForPassthroughAppsAndSettingsDecode() throws {
        let passthrough = try GatehouseConfiguration.decode(C.document(), secrets: C.secrets)
        #expect(passthrough.clients["com.example.app"]?.dpop == .off)
        let found = Self.problems(C.document(client: [("dpop", C.scalar("required"))]))
        #expect(found["clients[0].dpop"]?.contains("sealed") == true)
        let configuration = try GatehouseConfiguration.decode(Self.document(extra: [("dpop", C.map([
            ("nonce", C.scalar("true")), ("proof_lifetime", C.scalar("30s")), ("replay_cache_entries", C.scalar("5000")),
        ]))]), secrets: Self.files)
        #expect(configuration.dpop.requireNonce && configuration.dpop.proofLifetime == .seconds(30) && configuration.dpop.replayCacheEntries == 5000)
    }

    @Test func instanceIDsNameTheirAppOnlyWhenItRegistersInstances() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document(client: [("instances", C.map([]))]), secrets: Self.files)
        let id = InstanceID.make(app: "com.example.app")
        #expect(InstanceID.split(id)?.app == "com.example.app")
        #expect(configuration.appClient(for: id)?.clientID == id)
        #expect(configuration.appClient(for: id)?.isInstance == true)
        #expect(configuration.appClient(for: "com.example.app")?.isInstance == false)
        #expect(configuration.appClient(for: "com.example.app~short") == nil)
        #expect(configuration.appClient(for: "com.other~" + SecureToken.generate()) == nil)
        #expect(configuration.appClient(for: "com.example.app~" + SecureToken.generate() + "!") == nil)
        let without = try GatehouseConfiguration.decode(Self.document(), secrets: Self.files)
        #expect(without.appClient(for: id) == nil)
    }
}
