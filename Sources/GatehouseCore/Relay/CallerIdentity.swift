public import Foundation

/// Who is calling, as an identity service told Gatehouse: one value whatever the service
/// (personal-information service, introspection, userinfo, JWT).
///
/// A final class so that a cache of a million entries holds one pointer each.
public final class CallerIdentity: Sendable, Equatable, CustomStringConvertible {
    public let subject: String?
    /// The business-partner id.
    public let bpid: String?
    /// When the token itself expires, when the identity service says.
    public let expiresAt: Date?
    // Stored compactly: a short scope string stays inline (no allocation), attributes are a
    // small array of pairs rather than a dictionary. A million cached identities must fit
    // in a few hundred MiB (see Benchmarks/).
    private let scopeText: String?
    private let attributePairs: [(name: String, value: String)]

    public init(subject: String?, bpid: String?, scopes: Set<String>?, attributes: [String: String], expiresAt: Date?) {
        self.subject = subject
        self.bpid = bpid
        self.scopeText = scopes.map { $0.sorted().joined(separator: " ") }
        self.attributePairs = attributes.sorted { $0.key < $1.key }.map { (name: $0.key, value: $0.value) }
        self.expiresAt = expiresAt
    }

    /// The token's scopes; `nil` when the identity service does not say.
    public var scopes: Set<String>? {
        scopeText.map { Set($0.split(separator: " ").map(String.init)) }
    }

    /// Further attributes by their configured names (for example `bpid_status`).
    public var attributes: [String: String] {
        Dictionary(attributePairs.map { ($0.name, $0.value) }, uniquingKeysWith: { first, _ in first })
    }

    /// Whether the token carries `scope`, without building a set.
    public func hasScope(_ scope: String) -> Bool {
        scopeText?.split(separator: " ").contains { $0 == scope } ?? false
    }

    /// The value of a source named in the configuration: `subject`, `bpid`, `scopes` or an attribute.
    public func value(of source: String) -> String? {
        switch source {
        case "subject": subject
        case "bpid": bpid
        case "scopes": scopeText
        default: attributePairs.first { $0.name == source }?.value
        }
    }

    public static func == (lhs: CallerIdentity, rhs: CallerIdentity) -> Bool {
        lhs.subject == rhs.subject && lhs.bpid == rhs.bpid && lhs.scopeText == rhs.scopeText
            && lhs.attributes == rhs.attributes && lhs.expiresAt == rhs.expiresAt
    }

    /// Names only: an identity is personal data, and logs carry none of it.
    public var description: String { "CallerIdentity(<redacted>)" }
}

/// What an identity service said about a token.
public enum IdentityResolution: Sendable, Equatable {
    case active(CallerIdentity)
    /// Unknown, expired, revoked or otherwise inactive: the app must sign in again.
    case inactive
}

/// The identity service could not answer; nobody is signed out for it.
public struct IdentityUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Reason: String, Sendable { case unreachable, timeout, badResponse }
    public let reason: Reason
    public let detail: String

    public init(_ reason: Reason, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }
}
