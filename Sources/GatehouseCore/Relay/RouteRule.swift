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
        if let missing = scopes.sorted().first(where: { !identity.hasScope($0) }) {
            return "this route requires the scope '\(missing)'"
        }
        for (source, expected) in attributes.sorted(by: { $0.key < $1.key }) {
            let actual = identity.value(of: source) ?? ""
            if expected == "*" ? actual.isEmpty : actual != expected {
                return expected == "*" ? "this route requires a value for '\(source)'" : "this route requires '\(source)' to be '\(expected)'"
            }
        }
        return nil
    }
}
