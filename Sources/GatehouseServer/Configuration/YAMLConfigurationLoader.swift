import Crypto
public import Foundation
import NIOSSL
public import GatehouseCore
import Synchronization
public import GatehouseUpstreams
import Yams

/// Reads the YAML configuration file into `GatehouseConfiguration`.
public enum YAMLConfigurationLoader {
    /// Loads and validates a configuration file; every problem is listed with its path and line.
    ///
    /// Relative `client_secret_file` and `sqlite_path` values are resolved against the file's folder.
    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigErrors) -> GatehouseConfiguration
    {
        try loadSource(path: path, environment: environment).configuration
    }

    /// Loads a configuration file and also returns what it was made from (a reload compares them).
    public static func loadSource(path: String, environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigErrors) -> (configuration: GatehouseConfiguration, source: ConfigurationSource)
    {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigErrors(problems: [ConfigProblem(path: "(file)", line: 0, message: "cannot read \(path)")])
        }
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent()
        return try loadSource(yaml: text, baseDirectory: folder, environment: environment)
    }

    /// Validates configuration text; `baseDirectory` resolves relative paths; `kinds`: the upstream kinds it may name.
    public static func load(yaml text: String, baseDirectory: URL, environment: [String: String],
                            kinds: [String: UpstreamRegistry.Kind] = UpstreamRegistry.kinds) throws(ConfigErrors) -> GatehouseConfiguration
    {
        try loadSource(yaml: text, baseDirectory: baseDirectory, environment: environment, kinds: kinds).configuration
    }

    static func loadSource(yaml text: String, baseDirectory: URL, environment: [String: String],
                           kinds: [String: UpstreamRegistry.Kind] = UpstreamRegistry.kinds) throws(ConfigErrors)
        -> (configuration: GatehouseConfiguration, source: ConfigurationSource)
    {
        let root: ConfigNode
        do {
            guard let node = try Yams.compose(yaml: text) else {
                throw ConfigErrors(problems: [ConfigProblem(path: "(document)", line: 0, message: "the file is empty")])
            }
            root = convert(node)
        } catch let error as ConfigErrors {
            throw error
        } catch let error as YamlError {
            throw ConfigErrors(problems: [ConfigProblem(path: "(document)", line: Self.line(of: error), message: "is not valid YAML")])
        } catch {
            throw ConfigErrors(problems: [ConfigProblem(path: "(document)", line: 0, message: "is not valid YAML")])
        }
        let digests = Mutex<[String: String]>([:])
        let secrets = GatehouseConfiguration.SecretLookup(
            environment: { environment[$0] },
            readFile: { path in
                let content = try String(contentsOf: resolve(path, against: baseDirectory), encoding: .utf8)
                digests.withLock { $0[path] = SHA256.hash(data: Data(content.utf8)).map { String(format: "%02x", $0) }.joined() }
                return content
            })
        var configuration = try GatehouseConfiguration.decode(root, secrets: secrets, kinds: kinds.mapValues(\.decoder))
        // The decoder saw a PEM marker; that the certificates parse is known only to NIOSSL.
        let unreadable = configuration.routes.enumerated().filter { _, route in
            guard let pem = route.backendTrustRootsPEM else { return false }
            return ((try? NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))) ?? []).isEmpty
        }
        var problems = unreadable.map { index, _ in
            ConfigProblem(path: "routes[\(index)].backend_ca_file", line: 0, message: "holds no certificate that can be read (a truncated or damaged PEM?)")
        }
        // An upstream's ca_file and client certificate were read by the decoder; NIOSSL, which
        // presents and checks them, must read them too.
        for upstream in configuration.upstreams.values.sorted(by: { $0.name < $1.name }) {
            do {
                _ = try upstream.tlsConfiguration()
            } catch {
                problems.append(ConfigProblem(path: "upstreams", line: 0, message:
                    "the ca_file or client_certificate of '\(upstream.name)' cannot be read by the TLS library (a damaged PEM?)"))
            }
        }
        if !problems.isEmpty { throw ConfigErrors(problems: problems) }
        if configuration.store.sqlitePath != ":memory:" {
            configuration.store.sqlitePath = resolve(configuration.store.sqlitePath, against: baseDirectory).path
        }
        return (configuration, ConfigurationSource(document: root, fileDigests: digests.withLock { $0 }))
    }

    /// The keys the decoder asks for in a configuration text, valid or not (files are read
    /// against `baseDirectory` as in `load`); nil when the text is not YAML. The configuration
    /// reference is checked against the union over documents that reach every mapping.
    public static func keysAsked(yaml text: String, baseDirectory: URL, environment: [String: String]) -> Set<String>? {
        guard let node = try? Yams.compose(yaml: text) else { return nil }
        let secrets = GatehouseConfiguration.SecretLookup(
            environment: { environment[$0] },
            readFile: { try String(contentsOf: resolve($0, against: baseDirectory), encoding: .utf8) })
        return GatehouseConfiguration.keysAsked(decoding: convert(node), secrets: secrets, kinds: UpstreamRegistry.decoders)
    }

    private static func resolve(_ path: String, against folder: URL) -> URL {
        path.hasPrefix("/") ? URL(fileURLWithPath: path) : folder.appendingPathComponent(path)
    }

    private static func convert(_ node: Node) -> ConfigNode {
        let line = node.mark.map { $0.line } ?? 0
        switch node {
        case .scalar(let scalar):
            if scalar.style == .plain, ["", "~", "null", "Null", "NULL"].contains(scalar.string) {
                return .null(line: line)
            }
            return .scalar(scalar.string, line: line)
        case .mapping(let mapping):
            return .mapping(mapping.map { (key: $0.key.string ?? "\($0.key)", value: convert($0.value)) }, line: line)
        case .sequence(let sequence):
            return .sequence(sequence.map(convert), line: line)
        case .alias:
            return .null(line: line)
        }
    }

    private static func line(of error: YamlError) -> Int {
        switch error {
        case .scanner(_, _, let mark, _), .parser(_, _, let mark, _), .composer(_, _, let mark, _):
            return mark.line
        default:
            return 0
        }
    }
}

/// What a configuration was made from: its document and the files it read (secrets, keys).
public struct ConfigurationSource: Sendable {
    public let document: ConfigNode
    /// The SHA-256 (hex) of each file read, by the path as the document names it: a reload
    /// finds a secret file whose content changed though the document did not.
    public let fileDigests: [String: String]
}
