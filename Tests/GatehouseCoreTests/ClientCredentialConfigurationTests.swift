import Foundation
@testable import GatehouseCore
import GatehouseUpstreams
import Testing

/// `client_auth` with a key: `client_assertion`, `client_certificate`, `ca_file` and
/// `pushed_authorization_requests` read and checked when the configuration is, each problem
/// under its own path (the keys and certificates in Tests/Fixtures/client-auth).
struct ClientCredentialConfigurationTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/client-auth").path

    static func s(_ text: String) -> ConfigNode { .scalar(text, line: 0) }
    static func m(_ entries: [(String, ConfigNode)]) -> ConfigNode { .mapping(entries.map { (key: $0.0, value: $0.1) }, line: 0) }
    static func list(_ items: [String]) -> ConfigNode { .sequence(items.map(s), line: 0) }
    static func file(_ name: String) -> String { fixtures + "/" + name }

    static func document(kind: String = "oidc", _ entries: [(String, ConfigNode)]) -> ConfigNode {
        let endpoints: [(String, ConfigNode)] = switch kind {
        case "oidc": [("issuer", s("https://id.example.com"))]
        case "oauth2": [("authorization_endpoint", s("https://as.example.com/authorize")), ("token_endpoint", s("https://as.example.com/token"))]
        default: []
        }
        return m([
            ("server", m([("public_base_url", s("https://gatehouse.example.com"))])),
            ("store", m([("sqlite_path", s("/tmp/g.sqlite"))])),
            ("upstreams", .sequence([m([("name", s("modern")), ("kind", s(kind)), ("client_id", s("gatehouse"))] + endpoints + entries)],
                                    line: 0)),
            ("clients", .sequence([m([
                ("client_id", s("com.example.app")), ("upstream", s("modern")), ("token_exposure", s("passthrough")),
                ("redirect_uris", list(["com.example.app:/cb"])),
            ])], line: 0)),
        ])
    }

    static let secrets = GatehouseConfiguration.SecretLookup(
        environment: { $0 == "SECRET" ? "s3cret" : nil },
        readFile: { try String(contentsOfFile: $0, encoding: .utf8) })

    static func problems(_ document: ConfigNode) -> [String] {
        ConfigurationTests.problems(document, secrets: secrets)
    }

    static func assertion(_ entries: [(String, ConfigNode)]) -> (String, ConfigNode) { ("client_assertion", m(entries)) }

    @Test func privateKeyJWTReadsItsKeysFirstSigningWithTheirThumbprints() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document([
            ("client_auth", Self.s("private_key_jwt")),
            Self.assertion([("keys", Self.list([Self.file("client-key.pem"), Self.file("rsa-2048.pem")])), ("audience", Self.s("token_endpoint")),
                            ("lifetime", Self.s("30s"))]),
            ("ca_file", Self.s(Self.file("client.pem"))),
        ]), secrets: Self.secrets)
        let upstream = try #require(configuration.upstreams["modern"])
        let assertion = try #require(upstream.clientAssertion)
        #expect(assertion.keys.map(\.algorithm) == [.es256, .rs256])
        #expect(assertion.audience == .tokenEndpoint && assertion.lifetime == .seconds(30))
        #expect(upstream.publishedKeys.map { $0["kid"] } == assertion.keys.map(\.keyID))
        #expect(upstream.publishedKeys.allSatisfy { $0["d"] == nil })
        #expect(upstream.trustRootsPEM?.contains("BEGIN CERTIFICATE") == true)
        #expect(upstream.clientSecret.reveal().isEmpty)
        #expect(upstream.pushedAuthorization == .auto)
    }

    @Test func aSecretBesideAKeyIsAProblem() {
        let problems = Self.problems(Self.document([
            ("client_auth", Self.s("private_key_jwt")), ("client_secret_env", Self.s("SECRET")),
            Self.assertion([("keys", Self.list([Self.file("client-key.pem")]))]),
        ]))
        #expect(problems == ["upstreams[0].client_secret_env: a secret and a key for the same upstream: private_key_jwt sends no secret, so remove client_secret_env"])
    }

    @Test func eachMethodNeedsItsOwnCredentialAndNoOther() {
        #expect(Self.problems(Self.document([("client_auth", Self.s("private_key_jwt"))])).first?
            .hasPrefix("upstreams[0].client_assertion: is required with client_auth: private_key_jwt") == true)
        #expect(Self.problems(Self.document([("client_auth", Self.s("tls_client_auth"))])).first?
            .hasPrefix("upstreams[0].client_certificate: is required with client_auth: tls_client_auth") == true)
        let stray = Self.problems(Self.document([
            ("client_secret_env", Self.s("SECRET")), Self.assertion([("keys", Self.list([Self.file("client-key.pem")]))]),
        ]))
        #expect(stray == ["upstreams[0].client_assertion: applies only with client_auth: private_key_jwt"])
    }

    @Test(arguments: [
        ("missing.pem", nil, "cannot read the file"),
        ("client.pem", nil, "holds no PEM private key"),
        ("rsa-1024.pem", nil, "is a 1024-bit RSA key"),
        ("p384.pem", nil, "holds no PEM private key"),
        ("rsa-2048.pem", "ES256", "is an RSA key, which signs RS256 or PS256"),
    ] as [(String, String?, String)])
    func aKeyThatCannotSignIsAProblemAtItsPath(file: String, algorithm: String?, message: String) {
        var entries: [(String, ConfigNode)] = [("keys", Self.list([Self.file(file)]))]
        if let algorithm { entries.append(("algorithm", Self.s(algorithm))) }
        let problems = Self.problems(Self.document([("client_auth", Self.s("private_key_jwt")), Self.assertion(entries)]))
        #expect(problems.count == 1)
        #expect(problems.first?.hasPrefix("upstreams[0].client_assertion.keys[0]: ") == true, "\(problems)")
        #expect(problems.first?.contains(message) == true, "\(problems)")
    }

    @Test func theSameKeyTwiceAKidForSeveralKeysAndAnAudienceThatIsNoURLAreProblems() {
        let problems = Self.problems(Self.document([
            ("client_auth", Self.s("private_key_jwt")),
            Self.assertion([("keys", Self.list([Self.file("client-key.pem"), Self.file("client-combined.pem")])), ("kid", Self.s("k1")),
                            ("audience", Self.s("the issuer"))]),
        ]))
        #expect(problems.contains { $0.hasPrefix("upstreams[0].client_assertion.keys[1]: is the same key as another") }, "\(problems)")
        #expect(problems.contains { $0.hasPrefix("upstreams[0].client_assertion.kid: applies to a single key") }, "\(problems)")
        #expect(problems.contains { $0.hasPrefix("upstreams[0].client_assertion.audience: must be issuer, endpoint, token_endpoint or a URL") }, "\(problems)")
    }

    @Test func aKidNamesASingleKeyAndAnRSAAlgorithmLeavesAP256KeyOnES256() throws {
        let single = try GatehouseConfiguration.decode(Self.document([
            ("client_auth", Self.s("private_key_jwt")), Self.assertion([("keys", Self.list([Self.file("client-key.pem")])), ("kid", Self.s("k1"))]),
        ]), secrets: Self.secrets)
        let key = try #require(single.upstreams["modern"]?.clientAssertion?.keys.first)
        #expect(key.keyID == "k1" && key.thumbprint != "k1" && key.publicJWK["kid"] == "k1")
        // A rotation from an EC key to a PS256 RSA key: each signs what it can.
        let mixed = try GatehouseConfiguration.decode(Self.document([
            ("client_auth", Self.s("private_key_jwt")),
            Self.assertion([("keys", Self.list([Self.file("ec-with-parameters.pem"), Self.file("rsa-2048.pem")])), ("algorithm", Self.s("PS256"))]),
        ]), secrets: Self.secrets)
        #expect(mixed.upstreams["modern"]?.clientAssertion?.keys.map(\.algorithm) == [.es256, .ps256])
    }

    @Test func introspectionTakesAnyAudienceSinceItsAssertionsNameTheIntrospectionEndpoint() throws {
        let identity: (String, ConfigNode) = ("identity", Self.m([("kind", Self.s("introspection")), ("url", Self.s("https://id.example.com/introspect"))]))
        for audience in ["token_endpoint", "endpoint", "issuer"] {
            let configuration = try GatehouseConfiguration.decode(Self.document([
                ("client_auth", Self.s("private_key_jwt")), identity,
                Self.assertion([("keys", Self.list([Self.file("client-key.pem")])), ("audience", Self.s(audience))]),
            ]), secrets: Self.secrets)
            let expected: ClientAssertionAudience = audience == "endpoint" ? .endpoint : audience == "issuer" ? .issuer : .tokenEndpoint
            #expect(configuration.upstreams["modern"]?.clientAssertion?.audience == expected)
        }
    }

    @Test func oneAssertionKeyOnTwoUpstreamsIsAProblemAtTheSecondWithItsLine() {
        func upstream(_ name: String, _ keys: [String], line: Int) -> ConfigNode {
            Self.m([("name", Self.s(name)), ("kind", Self.s("oidc")), ("client_id", Self.s("gatehouse")), ("issuer", Self.s("https://\(name).example.com")),
                    ("client_auth", Self.s("private_key_jwt")),
                    ("client_assertion", Self.m([("keys", .sequence(keys.map { ConfigNode.scalar($0, line: line) }, line: line))]))])
        }
        // The same key in two files (a copy, so the thumbprint decides, not the path).
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-key-copy-\(UUID().uuidString).pem")
        try? FileManager.default.copyItem(atPath: Self.file("client-key.pem"), toPath: copy.path)
        defer { try? FileManager.default.removeItem(at: copy) }
        let document = Self.m([
            ("server", Self.m([("public_base_url", Self.s("https://gatehouse.example.com"))])),
            ("store", Self.m([("sqlite_path", Self.s("/tmp/g.sqlite"))])),
            ("upstreams", .sequence([upstream("first", [Self.file("client-key.pem")], line: 7),
                                     upstream("second", [Self.file("rsa-2048.pem"), copy.path], line: 15)], line: 0)),
            ("clients", .sequence([], line: 0)),
        ])
        do {
            _ = try GatehouseConfiguration.decode(document, secrets: Self.secrets)
            Issue.record("one key on two upstreams was accepted")
        } catch {
            let shared = error.problems.filter { $0.message.contains("is the key of the upstream 'first' too") }
            #expect(shared.map(\.path) == ["upstreams[1].client_assertion.keys[1]"], "\(error.problems)")
            #expect(shared.first?.line == 15)
            #expect(shared.first?.message.contains("upstreams[0].client_assertion.keys[0]") == true)
        }
    }

    @Test(arguments: [
        ("client.pem", "client-key.pem", nil),
        ("client-combined.pem", "client-combined.pem", nil),
        ("client.pem", "other-key.pem", "upstreams[0].client_certificate.key: "),
        ("client-key.pem", "client-key.pem", "upstreams[0].client_certificate.certificate: "),
        ("client.pem", "missing.pem", "upstreams[0].client_certificate.key: "),
    ] as [(String, String, String?)])
    func aClientCertificateMustParseBeInDateAndBeTheKeys(certificate: String, key: String, problem: String?) throws {
        let document = Self.document([
            ("client_auth", Self.s("self_signed_tls_client_auth")),
            ("client_certificate", Self.m([("certificate", Self.s(Self.file(certificate))), ("key", Self.s(Self.file(key)))])),
        ])
        let problems = Self.problems(document)
        guard let problem else {
            #expect(problems.isEmpty)
            let upstream = try #require(try GatehouseConfiguration.decode(document, secrets: Self.secrets).upstreams["modern"])
            // A self-signed certificate is published as a JWK with its x5c (RFC 8705 §2.2).
            #expect(upstream.publishedKeys.count == 1 && upstream.publishedKeys[0]["kty"] == "EC")
            let document = try #require(try JSONSerialization.jsonObject(with: upstream.publishedKeysDocument) as? [String: [[String: Any]]])
            let chain = try #require(document["keys"]?.first?["x5c"] as? [String])
            let der = try #require(chain.first.flatMap { Data(base64Encoded: $0) })
            let pem = try String(contentsOfFile: Self.file(certificate), encoding: .utf8)
            #expect(pem.contains(der.base64EncodedString().prefix(64)))
            return
        }
        #expect(problems.count == 1 && problems[0].hasPrefix(problem), "\(problems)")
    }

    /// An expired certificate stops its upstream (which refuses it), not the gateway: it is read,
    /// and `UpstreamHTTP` warns of it at start.
    @Test func anExpiredCertificateIsReadWithItsValidity() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document([
            ("client_auth", Self.s("tls_client_auth")),
            ("client_certificate", Self.m([("certificate", Self.s(Self.file("expired.pem"))), ("key", Self.s(Self.file("expired-key.pem")))])),
        ]), secrets: Self.secrets)
        let certificate = try #require(configuration.upstreams["modern"]?.clientCertificate)
        #expect(certificate.notValidAfter < Date(timeIntervalSince1970: 1_640_995_200))  // before 2022
    }

    @Test func kindsThatSpeakNoKeysRefuseThemAndHS256NeedsASecret() {
        let franceConnect = Self.problems(Self.document(kind: "franceconnect", [
            ("client_secret_env", Self.s("SECRET")), ("client_auth", Self.s("private_key_jwt")), ("pushed_authorization_requests", Self.s("always")),
            Self.assertion([("keys", Self.list([Self.file("client-key.pem")]))]),
        ]))
        #expect(franceConnect.contains("upstreams[0].client_auth: a franceconnect upstream authenticates with client_secret_basic or client_secret_post"))
        #expect(franceConnect.contains("upstreams[0].pushed_authorization_requests: a franceconnect upstream takes no pushed authorization requests"))
        let hs256 = Self.problems(Self.document([
            ("client_auth", Self.s("tls_client_auth")), ("id_token_signing_alg", Self.s("HS256")),
            ("client_certificate", Self.m([("certificate", Self.s(Self.file("client.pem"))), ("key", Self.s(Self.file("client-key.pem")))])),
        ]))
        #expect(hs256 == ["upstreams[0].id_token_signing_alg: HS256 ID tokens are keyed with the client secret, and client_auth tls_client_auth has none"])
    }

    @Test func anOAuth2UpstreamPushesWhenItsPAREndpointIsConfiguredAndAlwaysNeedsOne() throws {
        let always = Self.problems(Self.document(kind: "oauth2", [("client_secret_env", Self.s("SECRET")),
                                                                  ("pushed_authorization_requests", Self.s("always"))]))
        #expect(always.first?.hasPrefix("upstreams[0].pushed_authorization_request_endpoint: is required with pushed_authorization_requests: always") == true)
        let configured = try GatehouseConfiguration.decode(Self.document(kind: "oauth2", [
            ("client_secret_env", Self.s("SECRET")), ("pushed_authorization_request_endpoint", Self.s("https://as.example.com/par")),
        ]), secrets: Self.secrets)
        let oauth2 = try #require(configured.upstreams["modern"]?.profile as? OAuth2Settings)
        #expect(oauth2.pushedAuthorizationRequestEndpoint == "https://as.example.com/par")
    }

    @Test func aPublishedKeySetNeedsAnUpstreamNameThatIsAPathSegment() {
        var document = Self.document([("client_auth", Self.s("private_key_jwt")), Self.assertion([("keys", Self.list([Self.file("client-key.pem")]))])])
        guard case .mapping(var top, let line) = document, let index = top.firstIndex(where: { $0.key == "upstreams" }),
              case .sequence(var upstreams, _) = top[index].value, case .mapping(var entries, _) = upstreams[0] else {
            Issue.record("unexpected document"); return
        }
        entries[0].value = Self.s("my upstream/x")
        upstreams[0] = .mapping(entries, line: 0)
        top[index].value = .sequence(upstreams, line: 0)
        if let client = top.firstIndex(where: { $0.key == "clients" }), case .sequence(var clients, _) = top[client].value,
           case .mapping(var fields, _) = clients[0] {
            fields[1].value = Self.s("my upstream/x")
            clients[0] = .mapping(fields, line: 0)
            top[client].value = .sequence(clients, line: 0)
        }
        document = .mapping(top, line: line)
        #expect(Self.problems(document).contains { $0.hasPrefix("upstreams[0].name: must be letters, digits") })
    }
}
