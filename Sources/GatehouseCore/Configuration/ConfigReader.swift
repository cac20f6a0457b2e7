/// Walks a `ConfigNode` tree, collecting every problem instead of stopping at the first.
///
/// Each mapping remembers the keys that were read; `finish()` reports the others as unknown,
/// so a misspelt key is an error rather than a setting silently ignored.
public final class ConfigReader {
    public private(set) var problems: [ConfigProblem] = []
    /// Every key a mapping asked for, as a path with list positions written `[]`
    /// (`upstreams[].identity.url`): the settings the decoder accepts where it looked. The
    /// configuration reference is checked against it.
    public private(set) var keysAsked: Set<String> = []

    public init() {}

    public func report(_ path: String, _ node: ConfigNode?, _ message: String) {
        problems.append(ConfigProblem(path: path, line: node?.line ?? 0, message: message))
    }

    func asked(_ path: String) {
        keysAsked.insert(path.replacing(/\[[0-9]+\]/, with: "[]"))
    }

    public func mapping(_ node: ConfigNode, at path: String) -> MappingReader? {
        mapping(node, at: path, namesAreSettings: true)
    }

    func mapping(_ node: ConfigNode, at path: String, namesAreSettings: Bool) -> MappingReader? {
        guard case .mapping(let entries, _) = node else {
            report(path, node, "must be a mapping, found \(node.kindName)")
            return nil
        }
        var seen: Set<String> = []
        for entry in entries where !seen.insert(entry.key).inserted {
            report(path + "." + entry.key, entry.value, "is given more than once")
        }
        return MappingReader(reader: self, path: path, node: node, entries: entries, namesAreSettings: namesAreSettings)
    }

    public func list(_ node: ConfigNode, at path: String) -> [(node: ConfigNode, path: String)]? {
        guard case .sequence(let items, _) = node else {
            report(path, node, "must be a list, found \(node.kindName)")
            return nil
        }
        return items.enumerated().map { (node: $0.element, path: "\(path)[\($0.offset)]") }
    }

    public func string(_ node: ConfigNode, at path: String) -> String? {
        guard case .scalar(let value, _) = node else {
            report(path, node, "must be a string, found \(node.kindName)")
            return nil
        }
        return value
    }
}

/// The keys of one mapping, read one at a time.
public final class MappingReader {
    public let reader: ConfigReader
    public let path: String
    public let node: ConfigNode
    private let entries: [(key: String, value: ConfigNode)]
    private var used: Set<String> = []
    /// False for a map whose names the user chooses (attribute names, header names): its keys
    /// are data, not settings, and are not recorded in `ConfigReader.keysAsked`.
    private let namesAreSettings: Bool

    init(reader: ConfigReader, path: String, node: ConfigNode, entries: [(key: String, value: ConfigNode)], namesAreSettings: Bool) {
        self.reader = reader
        self.path = path
        self.node = node
        self.entries = entries
        self.namesAreSettings = namesAreSettings
    }

    public func childPath(_ key: String) -> String { path.isEmpty ? key : path + "." + key }

    /// The node under `key`; reports it missing when `required`.
    public func value(_ key: String, required: Bool = false) -> ConfigNode? {
        used.insert(key)
        if namesAreSettings { reader.asked(childPath(key)) }
        guard let found = entry(key) else {
            if required { reader.report(childPath(key), node, "is required") }
            return nil
        }
        if case .null = found {
            if required { reader.report(childPath(key), found, "is required") }
            return nil
        }
        return found
    }

    /// The node under a key that is known only to be refused (an inline secret, say): it is
    /// reported by the caller, never "not a known setting", and it is no setting of the reference.
    public func refused(_ key: String) -> ConfigNode? {
        used.insert(key)
        return entry(key)
    }

    private func entry(_ key: String) -> ConfigNode? {
        entries.first(where: { $0.key == key })?.value
    }

    public func string(_ key: String, required: Bool = false) -> String? {
        value(key, required: required).flatMap { reader.string($0, at: childPath(key)) }
    }

    public func bool(_ key: String) -> Bool? {
        guard let node = value(key), let text = reader.string(node, at: childPath(key)) else { return nil }
        switch text {
        case "true": return true
        case "false": return false
        default:
            reader.report(childPath(key), node, "must be true or false")
            return nil
        }
    }

    public func integer(_ key: String, in range: ClosedRange<Int>) -> Int? {
        guard let node = value(key), let text = reader.string(node, at: childPath(key)) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            reader.report(childPath(key), node, "must be a whole number from \(range.lowerBound) to \(range.upperBound)")
            return nil
        }
        return number
    }

    /// A duration written as `90s`, `500ms`, `10m`, `1h`, `30d` or a bare number of seconds.
    public func duration(_ key: String, in range: ClosedRange<Duration>) -> Duration? {
        guard let node = value(key), let text = reader.string(node, at: childPath(key)) else { return nil }
        guard let duration = Self.parseDuration(text), range.contains(duration) else {
            reader.report(childPath(key), node,
                          "must be a duration such as 500ms, 30s or 10m, from \(range.lowerBound) to \(range.upperBound)")
            return nil
        }
        return duration
    }

    public func stringList(_ key: String, required: Bool = false) -> [String]? {
        guard let node = value(key, required: required),
              let items = reader.list(node, at: childPath(key)) else { return nil }
        return items.compactMap { reader.string($0.node, at: $0.path) }
    }

    public func mapping(_ key: String, required: Bool = false) -> MappingReader? {
        value(key, required: required).flatMap { reader.mapping($0, at: childPath(key)) }
    }

    /// A map whose names the user chooses (`attributes`, `identity_headers`): name → value.
    public func namedMapping(_ key: String) -> MappingReader? {
        value(key).flatMap { reader.mapping($0, at: childPath(key), namesAreSettings: false) }
    }

    public func list(_ key: String, required: Bool = false) -> [(node: ConfigNode, path: String)]? {
        value(key, required: required).flatMap { reader.list($0, at: childPath(key)) }
    }

    /// A value that must be one of a fixed set of words.
    public func choice<Choice: RawRepresentable & CaseIterable>(_ key: String, default fallback: Choice) -> Choice
    where Choice.RawValue == String {
        guard let node = value(key), let text = reader.string(node, at: childPath(key)) else { return fallback }
        guard let choice = Choice(rawValue: text) else {
            let allowed = Choice.allCases.map(\.rawValue).joined(separator: ", ")
            reader.report(childPath(key), node, "must be one of: \(allowed)")
            return fallback
        }
        return choice
    }

    /// Reports every key that no one read.
    public func finish() {
        for entry in entries where !used.contains(entry.key) {
            reader.report(childPath(entry.key), entry.value, "is not a known setting")
        }
    }

    public static func parseDuration(_ text: String) -> Duration? {
        let units: [(suffix: String, scale: Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600), ("d", 86400)]
        for unit in units where text.hasSuffix(unit.suffix) {
            guard let number = Double(text.dropLast(unit.suffix.count)), number.isFinite, number >= 0 else { return nil }
            return .milliseconds(Int64((number * unit.scale * 1000).rounded()))
        }
        guard let seconds = Double(text), seconds.isFinite, seconds >= 0 else { return nil }
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }
}
