public import Foundation
public import GatehouseCore

/// `identity: {kind: session}`: the caller is who the upstream's verified userinfo, kept in the
/// sealed session at sign-in, says (the kinds that verify who signed in). No call per request.
public enum SessionIdentity {
    /// The identity in a session's userinfo, at the paths the settings name (`/sub` by default).
    public static func identity(fromUserinfo userinfo: Data, settings: IdentitySettings) -> CallerIdentity? {
        guard let object = try? JSONSerialization.jsonObject(with: userinfo), object is [String: Any] else { return nil }
        return IdentityExtraction(settings: settings, defaultSubjectPaths: ["/sub"]).identity(fromJSON: object, expiresAt: nil)
    }
}
