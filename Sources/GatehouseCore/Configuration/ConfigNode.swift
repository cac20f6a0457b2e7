/// A parsed configuration document, independent of the YAML library that read it.
///
/// The server target turns YAML into this tree; Core validates it. Every node keeps the line
/// it came from so that each problem can name its place.
public indirect enum ConfigNode: Sendable, Equatable {
    case scalar(String, line: Int)
    case mapping([(key: String, value: ConfigNode)], line: Int)
    case sequence([ConfigNode], line: Int)
    case null(line: Int)

    /// The 1-based line of the node in its file (0 when unknown).
    public var line: Int {
        switch self {
        case .scalar(_, let line), .mapping(_, let line), .sequence(_, let line), .null(let line): line
        }
    }

    /// The value under `key` of a mapping (`nil` for another node): where a problem found after
    /// reading lies, for its line.
    public subscript(key: String) -> ConfigNode? {
        guard case .mapping(let entries, _) = self else { return nil }
        return entries.first { $0.key == key }?.value
    }

    /// The item at `index` of a list (`nil` for another node, or past its end).
    public subscript(index: Int) -> ConfigNode? {
        guard case .sequence(let items, _) = self, items.indices.contains(index) else { return nil }
        return items[index]
    }

    var kindName: String {
        switch self {
        case .scalar: "a scalar"
        case .mapping: "a mapping"
        case .sequence: "a list"
        case .null: "empty"
        }
    }

    public static func == (lhs: ConfigNode, rhs: ConfigNode) -> Bool {
        switch (lhs, rhs) {
        case (.scalar(let a, _), .scalar(let b, _)): a == b
        case (.sequence(let a, _), .sequence(let b, _)): a == b
        case (.null, .null): true
        case (.mapping(let a, _), .mapping(let b, _)):
            a.count == b.count && zip(a, b).allSatisfy { $0.key == $1.key && $0.value == $1.value }
        default: false
        }
    }
}

/// One thing wrong with a configuration: where (YAML path and line) and what.
public struct ConfigProblem: Sendable, Hashable, CustomStringConvertible {
    public let path: String
    public let line: Int
    public let message: String

    public init(path: String, line: Int, message: String) {
        self.path = path
        self.line = line
        self.message = message
    }

    public var description: String {
        line > 0 ? "line \(line): \(path): \(message)" : "\(path): \(message)"
    }
}

/// All the problems found in a configuration, thrown once at the end of validation.
public struct ConfigErrors: Error, Sendable, CustomStringConvertible {
    public let problems: [ConfigProblem]

    public init(problems: [ConfigProblem]) {
        self.problems = problems
    }

    public var description: String { problems.map(\.description).joined(separator: "\n") }
}
