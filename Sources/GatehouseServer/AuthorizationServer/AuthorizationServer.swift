import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseUpstreams
import GatehouseRelay
import Logging

/// The standard OAuth 2.0 authorization server apps see (RFC 6749, RFC 7636, RFC 8252): authorize,
/// the upstream's way back, token, revocation (RFC 7009), discovery (RFC 8414, OpenID), the key
/// set, and RP-Initiated Logout. It asks the upstream's profile for everything kind-specific, and
/// hands a sign-in to sealed sessions or to a minting kind when the app's configuration says so.
struct AuthorizationServer: RecordingFeature {
    let configuration: GatehouseConfiguration
    let store: any GatehouseStore
    let upstreams: [String: any UpstreamProfile]
    let now: @Sendable () -> Date
    let logger: Logger
    let audit: AuditLog
    let limits: RateLimiters
    let dpop: DPoPEnforcement
    /// Refreshes of passthrough apps' upstream tokens, coordinated across instances.
    let passthrough: PassthroughRefresher
    /// Gatehouse's key: ID tokens toward sealed apps, `/.well-known/jwks.json`.
    let signer: AssertionSigner?
    /// Sealed sessions, when configured: a sealed app's tokens, and a minting kind's.
    let sessions: SealedSessions?
    /// App instances, when an app has them: their grants are checked against their registration.
    let instances: AppInstances?
    /// The relay's identity cache, when routes are configured: a revoked upstream token's identity is dropped from it.
    let identityCache: IdentityCache?

    /// Sealed sessions for an app whose configuration needs them (the configuration guarantees
    /// them: a sealed app is refused without a `sessions` section).
    func sealedSessions() throws(OAuthError) -> SealedSessions {
        guard let sessions else { throw .serverError("sealed sessions are not configured") }
        return sessions
    }

    /// App instances for a client that is one (the configuration guarantees them: an instance's
    /// client id names an app with `instances`).
    func appInstances() throws(OAuthError) -> AppInstances {
        guard let instances else { throw .invalidClient("client_id names no registered app instance") }
        return instances
    }
}

/// How an app's tokens are made, resolved once per request from the app's configuration and its
/// upstream's profile: the upstream's tokens as they are (passthrough), Gatehouse's pair over a
/// sealed session, or the tokens the upstream's kind mints. The token, revoke and logout routes
/// switch over this once instead of testing the client's settings and the profile each time.
enum AppTokens {
    case passthrough
    case sealed(SealedSessions)
    case minted(any TokenMinter, SealedSessions)
}

extension AuthorizationServer {
    /// `client`'s way of making tokens. A sealed or minting app without sealed sessions cannot be
    /// configured (the configuration is refused); were it to happen, the request fails as a server error.
    func appTokens(for client: AppClient) throws(OAuthError) -> AppTokens {
        if let minter = upstreams[client.upstream]?.minter { return .minted(minter, try sealedSessions()) }
        switch client.tokenExposure {
        case .passthrough: return .passthrough
        case .sealed: return .sealed(try sealedSessions())
        }
    }
}
