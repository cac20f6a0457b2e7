public import GatehouseCore

/// Turns an upstream access token into a caller identity: one implementation per kind of
/// identity service, chosen by the upstream's `identity.kind`.
///
/// `.inactive` means the token is dead (401 to the app). A thrown `IdentityUnavailable`
/// means the service could not say (503): an outage never signs anyone out.
public protocol IdentityResolver: Sendable {
    func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution
}
