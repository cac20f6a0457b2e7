/// What a caller must have for a route to be relayed (checked after the token is known good).
public struct RouteRule: Sendable, Equatable {
    /// Every one of these scopes.
    public var scopes: Set<String>
    /// Each source (`bpid`, `subject` or an attribute name) must have this value; `*` means any non-empty value.
    public var attributes: [String: String]

    public init(scopes: Set<String> = [], attributes: [String: String] = [:]) {
        self.scopes = scopes
        self.attributes = attributes
    }

    /// `nil` when the caller may pass; otherwise the rule they do not meet, in words fit for a 403.
    public func violation(by identity: CallerIdentity) -> String? {
        // The common case, a caller who passes, allocates nothing; the first rule broken, in
        // name order, is named.
        if !scopes.allSatisfy(identity.hasScope), let missing = scopes.sorted().first(where: { !identity.hasScope($0) }) {
            return "this route requires the scope '\(missing)'"
        }
        func broken(_ source: String, _ expected: String) -> Bool {
            let actual = identity.value(of: source) ?? ""
            return expected == "*" ? actual.isEmpty : actual != expected
        }
        guard attributes.contains(where: broken) else { return nil }
        for (source, expected) in attributes.sorted(by: { $0.key < $1.key }) where broken(source, expected) {
            return expected == "*" ? "this route requires a value for '\(source)'" : "this route requires '\(source)' to be '\(expected)'"
        }
        return nil
    }
}
