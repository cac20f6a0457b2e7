import Foundation
import GatehouseCore

/// Reads subject, BPId, scopes and attributes out of an identity service's answer, at the
/// paths the configuration names (JSON Pointers, or element paths for XML).
struct IdentityExtraction: Sendable {
    let settings: IdentitySettings
    /// Paths used when the configuration names none (for example `/sub` for userinfo).
    let defaultSubjectPaths: [String]

    func identity(fromJSON object: Any, expiresAt: Date?) -> CallerIdentity {
        func read(_ path: String?) -> String? { path.flatMap(JSONPointer.init)?.string(in: object) }
        let subject = read(settings.subjectPath) ?? defaultSubjectPaths.lazy.compactMap { read($0) }.first
        let scopes: Set<String>?
        if let path = settings.scopesPath ?? (settings.kind == .personalInformation ? nil : "/scope") {
            scopes = Self.scopes(JSONPointer(path)?.evaluate(object))
        } else {
            scopes = nil
        }
        return CallerIdentity(subject: subject, bpid: read(settings.bpidPath), scopes: scopes,
                              attributes: settings.attributePaths.compactMapValues { read($0) }, expiresAt: expiresAt)
    }

    func identity(fromXML data: Data) -> CallerIdentity? {
        var paths = Set(settings.attributePaths.values)
        for path in [settings.subjectPath, settings.bpidPath, settings.scopesPath].compactMap({ $0 }) { paths.insert(path) }
        guard let values = XMLValueReader.values(at: paths, in: data) else { return nil }
        return CallerIdentity(
            subject: settings.subjectPath.flatMap { values[$0] }, bpid: settings.bpidPath.flatMap { values[$0] },
            scopes: settings.scopesPath.flatMap { values[$0] }.map { Set($0.split(separator: " ").map(String.init)) },
            attributes: settings.attributePaths.compactMapValues { values[$0] }, expiresAt: nil)
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
