import Foundation
import GatehouseCore

/// Reads subject, BPId, scopes and attributes out of an identity service's answer, at the
/// paths the configuration names (JSON Pointers, or element paths for XML).
struct IdentityExtraction: Sendable {
    let settings: IdentitySettings
    /// Paths used when the configuration names none (for example `/sub` for userinfo).
    let defaultSubjectPaths: [String]
    /// One array of names for every identity of this service (see `CallerIdentity`).
    let attributeNames: AttributeNames

    init(settings: IdentitySettings, defaultSubjectPaths: [String]) {
        self.settings = settings
        self.defaultSubjectPaths = defaultSubjectPaths
        self.attributeNames = AttributeNames(settings.attributePaths.keys.sorted())
    }

    func identity(fromJSON object: Any, expiresAt: Date?) -> CallerIdentity {
        func read(_ path: String?) -> String? { path.flatMap(JSONPointer.init)?.string(in: object) }
        let subject = read(settings.subjectPath) ?? defaultSubjectPaths.lazy.compactMap { read($0) }.first
        let scopes: Set<String>?
        if let path = settings.scopesPath ?? (settings.kind == .personalInformation ? nil : "/scope") {
            scopes = Self.scopes(JSONPointer(path)?.evaluate(object))
        } else {
            scopes = nil
        }
        return CallerIdentity(subject: subject, bpid: read(settings.bpidPath), scopeText: scopes.map { $0.sorted().joined(separator: " ") },
                              attributeNames: attributeNames, attributeValues: attributeNames.names.map { read(settings.attributePaths[$0]) },
                              expiresAt: expiresAt)
    }

    func identity(fromXML data: Data) -> CallerIdentity? {
        var paths = Set(settings.attributePaths.values)
        for path in [settings.subjectPath, settings.bpidPath, settings.scopesPath].compactMap({ $0 }) { paths.insert(path) }
        guard let values = XMLValueReader.values(at: paths, in: data) else { return nil }
        return CallerIdentity(
            subject: settings.subjectPath.flatMap { values[$0] }, bpid: settings.bpidPath.flatMap { values[$0] },
            scopeText: settings.scopesPath.flatMap { values[$0] }.map { $0.split(separator: " ").sorted().joined(separator: " ") },
            attributeNames: attributeNames, attributeValues: attributeNames.names.map { settings.attributePaths[$0].flatMap { values[$0] } },
            expiresAt: nil)
    }

    /// `scope` as a space-separated string (RFC 7662, RFC 9068) or `scp` as an array.
    static func scopes(_ value: Any?) -> Set<String>? {
        switch value {
        case let text as String: Set(text.split(separator: " ").map(String.init))
        case let list as [Any]: Set(list.compactMap { $0 as? String })
        default: nil
        }
    }
}
