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
    // Stored compactly, because a million cached identities must fit in a few hundred MiB
    // (Benchmarks/): short strings stay inline (no allocation), the attribute names are one
    // array shared by every identity from the same service, and their values one string.
    private let scopeText: String?
    private let attributeNames: AttributeNames
    private let attributeValues: String

    public convenience init(subject: String?, bpid: String?, scopes: Set<String>?, attributes: [String: String], expiresAt: Date?) {
        let names = AttributeNames(attributes.keys.sorted())
        self.init(subject: subject, bpid: bpid, scopeText: scopes.map { $0.sorted().joined(separator: " ") },
                  attributeNames: names, attributeValues: names.names.map { attributes[$0] }, expiresAt: expiresAt)
    }

    /// The compact form: `attributeValues` in the order of `attributeNames` (`nil` for absent).
    public init(subject: String?, bpid: String?, scopeText: String?, attributeNames: AttributeNames,
                attributeValues: [String?], expiresAt: Date?) {
        self.subject = subject
        self.bpid = bpid
        self.scopeText = scopeText
        self.attributeNames = attributeNames
        self.attributeValues = attributeValues.map { value in
            value.map { AttributeNames.present + String($0.unicodeScalars.filter { $0 != AttributeNames.separatorScalar && $0 != AttributeNames.presentScalar }) } ?? ""
        }.joined(separator: AttributeNames.separator)
        self.expiresAt = expiresAt
    }

    /// The token's scopes; `nil` when the identity service does not say.
    public var scopes: Set<String>? {
        scopeText.map { Set($0.split(separator: " ").map(String.init)) }
    }

    /// Further attributes by their configured names (for example `bpid_status`).
    public var attributes: [String: String] {
        var result: [String: String] = [:]
        for (name, value) in zip(attributeNames.names, attributeValues.split(separator: AttributeNames.separatorCharacter, omittingEmptySubsequences: false))
        where value.first == AttributeNames.presentCharacter {
            result[name] = String(value.dropFirst())
        }
        return result
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
        default:
            attributeNames.names.firstIndex(of: source).flatMap { index in
                let values = attributeValues.split(separator: AttributeNames.separatorCharacter, omittingEmptySubsequences: false)
                guard index < values.count, values[index].first == AttributeNames.presentCharacter else { return nil }
                return String(values[index].dropFirst())
            }
        }
    }

    public static func == (lhs: CallerIdentity, rhs: CallerIdentity) -> Bool {
        lhs.subject == rhs.subject && lhs.bpid == rhs.bpid && lhs.scopeText == rhs.scopeText
            && lhs.attributes == rhs.attributes && lhs.expiresAt == rhs.expiresAt
    }

    /// Names only: an identity is personal data, and logs carry none of it.
    public var description: String { "CallerIdentity(<redacted>)" }
}

/// The attribute names of one identity service, in a fixed order, shared by its identities.
public final class AttributeNames: Sendable {
    public let names: [String]
    static let separator = "\u{1F}"
    static let separatorScalar: Unicode.Scalar = "\u{1F}"
    static let separatorCharacter: Character = "\u{1F}"
    /// Starts every present value, so that an empty value differs from an absent one.
    static let present = "\u{1E}"
    static let presentScalar: Unicode.Scalar = "\u{1E}"
    static let presentCharacter: Character = "\u{1E}"

    public init(_ names: [String]) {
        self.names = names
    }
}

/// What an identity service said about a token.
public enum IdentityResolution: Sendable, Equatable {
    case active(CallerIdentity)
    /// Unknown, expired, revoked or otherwise inactive: the app must sign in again.
    case inactive
}

/// The identity service could not answer; nobody is signed out for it.
public struct IdentityUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    /// `overloaded`: `rate_limits.identity_concurrency` calls are running and as many waiting; no call was made.
    public enum Reason: String, Sendable { case unreachable, timeout, badResponse, overloaded }
    public let reason: Reason
    public let detail: String

    public init(_ reason: Reason, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }
}
