public import Foundation
public import GatehouseCore
import GatehouseUpstreams
import Yams

/// Reads the YAML configuration file into `GatehouseConfiguration`.
public enum YAMLConfigurationLoader {
    /// Loads and validates a configuration file; every problem is listed with its path and line.
    ///
    /// Relative `client_secret_file` and `sqlite_path` values are resolved against the file's folder.
    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigErrors) -> GatehouseConfiguration
    {
        try loadDocument(path: path, environment: environment).configuration
    }

    /// Loads a configuration file and also returns its parsed document (a reload compares sections).
    public static func loadDocument(path: String, environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigErrors) -> (configuration: GatehouseConfiguration, document: ConfigNode)
    {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigErrors(problems: [ConfigProblem(path: "(file)", line: 0, message: "cannot read \(path)")])
        }
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent()
        return try loadDocument(yaml: text, baseDirectory: folder, environment: environment)
    }

    /// Validates configuration text; `baseDirectory` resolves relative paths.
    public static func load(yaml text: String, baseDirectory: URL, environment: [String: String]) throws(ConfigErrors)
        -> GatehouseConfiguration
    {
        try loadDocument(yaml: text, baseDirectory: baseDirectory, environment: environment).configuration
    }

    static func loadDocument(yaml text: String, baseDirectory: URL, environment: [String: String]) throws(ConfigErrors)
        -> (configuration: GatehouseConfiguration, document: ConfigNode)
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
        let secrets = GatehouseConfiguration.SecretLookup(
            environment: { environment[$0] },
            readFile: { path in
                try String(contentsOf: resolve(path, against: baseDirectory), encoding: .utf8)
            })
        var configuration = try GatehouseConfiguration.decode(root, secrets: secrets)
        if configuration.store.sqlitePath != ":memory:" {
            configuration.store.sqlitePath = resolve(configuration.store.sqlitePath, against: baseDirectory).path
        }
        return (configuration, root)
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
