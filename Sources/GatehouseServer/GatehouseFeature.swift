import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseRelay
import GatehouseUpstreams
import Hummingbird
import Logging

/// What every feature of Gatehouse shares: the configuration in force, the store, one profile
/// per upstream, the clock, the logs, the rate limits and DPoP (both one place for every face),
/// the refresher of passthrough tokens, and the signing key when one is needed.
struct GatehouseContext: Sendable {
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
    /// Gatehouse's ES256 key: assertions toward backends, ID tokens toward sealed apps, `/.well-known/jwks.json`.
    let signer: AssertionSigner?
}

/// One room of the house: a feature built from the context, owning its routes and state. The
/// context's members read as the feature's own, so a route handler names what it uses and
/// nothing it has to unwrap.
protocol GatehouseFeature: Sendable {
    var context: GatehouseContext { get }
}

extension GatehouseFeature {
    var configuration: GatehouseConfiguration { context.configuration }
    var store: any GatehouseStore { context.store }
    var upstreams: [String: any UpstreamProfile] { context.upstreams }
    var now: @Sendable () -> Date { context.now }
    var logger: Logger { context.logger }
    var audit: AuditLog { context.audit }
    var limits: RateLimiters { context.limits }
    var dpop: DPoPEnforcement { context.dpop }
    var passthrough: PassthroughRefresher { context.passthrough }
    var signer: AssertionSigner? { context.signer }

    /// The issuer identifier: the public base URL (RFC 8414 §2).
    var issuer: String { configuration.server.publicBaseURL }

    func expiry(after lifetime: Duration) -> Date {
        let (seconds, attoseconds) = lifetime.components
        return now().addingTimeInterval(Double(seconds) + Double(attoseconds) / 1e18)
    }
}

extension Optional where Wrapped: GatehouseFeature {
    /// The feature's answer, or a 404 `not_found` problem when the feature is not configured.
    func answer(_ request: Request, _ body: (Wrapped) async -> Response) async -> Response {
        guard let feature = self else { return .problem(.notFound(), for: request) }
        return await body(feature)
    }
}
