import Foundation
import GatehouseUpstreams
@testable import GatehouseCore
import Testing

/// `routes[].backend_ca_file`: read and checked when the configuration is, so a wrong file is
/// a configuration problem with its path rather than a 502 at the first request.
struct BackendTrustTests {
    typealias C = ConfigurationTests

    static func document(backend: String, caFile: String?) -> ConfigNode {
        guard case .mapping(var top, let line) = C.document(upstream: [
            ("identity", C.map([("kind", C.scalar("introspection")), ("url", C.scalar("https://as.example.com/introspect"))])),
        ]) else { return C.document() }
        var route: [(String, ConfigNode)] = [("prefix", C.scalar("/api")), ("backend", C.scalar(backend)), ("upstream", C.scalar("legacy"))]
        if let caFile { route.append(("backend_ca_file", C.scalar(caFile, 7))) }
        top.append((key: "routes", value: .sequence([C.map(route)], line: 0)))
        return .mapping(top, line: line)
    }

    static func file(_ text: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-ca-\(UUID().uuidString).pem").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Reads files for real (the shared lookup refuses every file).
    static let files = GatehouseConfiguration.SecretLookup(environment: C.secrets.environment,
                                                           readFile: { try String(contentsOfFile: $0, encoding: .utf8) })

    static let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

    @Test func aCertificateFileIsReadForAnHTTPSBackend() throws {
        let path = try Self.file(Self.pem)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let configuration = try GatehouseConfiguration.decode(Self.document(backend: "https://backend.internal/api", caFile: path), secrets: Self.files)
        #expect(configuration.routes.first?.backendTrustRootsPEM == Self.pem)
        let plain = try GatehouseConfiguration.decode(Self.document(backend: "https://backend.internal/api", caFile: nil), secrets: Self.files)
        #expect(plain.routes.first?.backendTrustRootsPEM == nil)
    }

    @Test func aWrongFileOrAPlainBackendIsAProblemWithItsPath() throws {
        let notPEM = try Self.file("just text\n")
        defer { try? FileManager.default.removeItem(atPath: notPEM) }
        let good = try Self.file(Self.pem)
        defer { try? FileManager.default.removeItem(atPath: good) }
        let cases: [(String, String, String)] = [
            ("http://backend.internal/api", good, "applies only to an https:// backend"),
            ("https://backend.internal/api", "/nonexistent/ca.pem", "cannot read the file /nonexistent/ca.pem"),
            ("https://backend.internal/api", notPEM, "holds no PEM certificate"),
        ]
        for (backend, file, expected) in cases {
            let problems = C.problems(Self.document(backend: backend, caFile: file), secrets: Self.files)
            #expect(problems.contains { $0.hasPrefix("routes[0].backend_ca_file: ") && $0.contains(expected) }, "\(problems)")
        }
    }
}
