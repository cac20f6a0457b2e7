public import Foundation
public import GatehouseCore
public import GatehouseUpstreams
public import Logging
public import GatehouseRelay
public import GatehouseSessions

/// Gatehouse, assembled from a configuration and the runtime that outlives it: the features the
/// configuration asks for, each built only when configured, from the dependencies it names, and
/// owning its routes (`GatehouseApplication.endpoints`):
///
/// - the authorization server face (authorize, callback, token, revoke, metadata, logout): always;
/// - sealed sessions (their tokens, `/userinfo`, session codes and web sessions, the sessions a
///   minting kind keeps): with a `sessions` section;
/// - app instances (registration, attestation, certification): when an app has `instances`;
/// - in-app sign-in (the authorization challenge endpoint): when an app has `in_app_sign_in: on`;
/// - the relay: with `routes`.
public struct Gatehouse: Sendable {
    public let configuration: GatehouseConfiguration
    /// What outlives this configuration: a reload builds the next `Gatehouse` from the same one.
    public let runtime: GatehouseRuntime
    /// The token buckets of `rate_limits`, taken from the runtime's.
    public let limits: RateLimiters
    let dpop: DPoPEnforcement
    let authorizationServer: AuthorizationServer
    let sealedSessions: SealedSessions?
    let appInstances: AppInstances?
    let inAppSignIn: InAppSignIn?
    let relayFace: RelayFace?
    /// The decision endpoint for the team's ingress (`forward_auth:`): the relay's admission, no data path.
    let forwardAuthFace: ForwardAuthFace?

    /// The Gatehouse of `configuration`, on `runtime`: the first one at start, and each one a
    /// reload builds (with the same runtime, so what outlives a configuration carries over).
    public init(configuration: GatehouseConfiguration, runtime: GatehouseRuntime) {
        self.configuration = configuration
        self.runtime = runtime
        let store = runtime.store, upstreams = runtime.upstreams, now = runtime.now, logger = runtime.logger, audit = runtime.audit
        let limits = RateLimiters(configuration.operations.rateLimits, audit: audit, buckets: runtime.buckets)
        let dpop = DPoPEnforcement(configuration: configuration, state: runtime.dpop, now: now)
        let relay = runtime.relayServices(for: configuration)
        self.limits = limits
        self.dpop = dpop
        let instances = configuration.clients.values.contains { $0.instances != nil }
            ? AppInstances(configuration: configuration, store: store, now: now, logger: logger, audit: audit, limits: limits, dpop: dpop,
                           mailer: runtime.mailer)
            : nil
        let sealed = runtime.sessions.map {
            SealedSessions(configuration: configuration, store: store, upstreams: upstreams, now: now, logger: logger, audit: audit,
                           limits: limits, dpop: dpop, signer: runtime.signer, services: $0, relay: relay, instances: instances)
        }
        appInstances = instances
        sealedSessions = sealed
        inAppSignIn = configuration.offersInAppSignIn
            ? InAppSignIn(configuration: configuration, store: store, upstreams: upstreams, now: now, logger: logger, audit: audit,
                          limits: limits, dpop: dpop, mailer: runtime.mailer, instances: instances)
            : nil
        authorizationServer = AuthorizationServer(
            configuration: configuration, store: store, upstreams: upstreams, now: now, logger: logger, audit: audit, limits: limits,
            dpop: dpop, passthrough: runtime.passthrough, signer: runtime.signer, sessions: sealed, instances: instances,
            identityCache: relay?.cache)
        let relayFace = relay.map {
            RelayFace(configuration: configuration, upstreams: upstreams, logger: logger, limits: limits, dpop: dpop,
                      services: $0, sealedSessions: sealed)
        }
        self.relayFace = relayFace
        forwardAuthFace = relayFace.flatMap { face in configuration.forwardAuth.map { ForwardAuthFace(relay: face, settings: $0, now: now) } }
    }

    /// A Gatehouse on a runtime of its own (tests and one-off commands): `relay`, a relay's
    /// cache, resolvers and backend client to use.
    public init(configuration: GatehouseConfiguration, store: any GatehouseStore, upstreams: [String: any UpstreamProfile],
                relay: RelayServices? = nil, sessions: SessionServices? = nil, signer: AssertionSigner? = nil,
                now: @escaping @Sendable () -> Date = Date.init, logger: Logger, audit: AuditLog = AuditLog()) {
        self.init(configuration: configuration, runtime: GatehouseRuntime(
            configuration: configuration, store: store, upstreams: upstreams, relay: relay, sessions: sessions, signer: signer, now: now,
            logger: logger, audit: audit))
    }

    /// The same, sending e-mail through `mailer` (a recorder in tests).
    init(configuration: GatehouseConfiguration, store: any GatehouseStore, upstreams: [String: any UpstreamProfile],
         relay: RelayServices? = nil, sessions: SessionServices? = nil, signer: AssertionSigner? = nil,
         now: @escaping @Sendable () -> Date = Date.init, logger: Logger, audit: AuditLog = AuditLog(), mailer: (any Mailer)?) {
        self.init(configuration: configuration, runtime: GatehouseRuntime(
            configuration: configuration, store: store, upstreams: upstreams, relay: relay, sessions: sessions, signer: signer, now: now,
            logger: logger, audit: audit, mailer: mailer))
    }

    public var store: any GatehouseStore { runtime.store }
    public var upstreams: [String: any UpstreamProfile] { runtime.upstreams }
    public var now: @Sendable () -> Date { runtime.now }
    public var logger: Logger { runtime.logger }
    public var audit: AuditLog { runtime.audit }
    public var signer: AssertionSigner? { runtime.signer }
    /// The resource relay's services; `nil` when no route is configured.
    public var relay: RelayServices? { relayFace?.services }
    /// Sealed sessions; `nil` without a `sessions` section.
    public var sessions: SessionServices? { runtime.sessions }
}
