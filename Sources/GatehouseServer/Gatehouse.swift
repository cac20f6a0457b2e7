public import Foundation
public import GatehouseCore
public import GatehouseUpstreams
public import Logging
public import GatehouseRelay
public import GatehouseSessions

/// Gatehouse, assembled: the context every feature shares and the features the configuration
/// asks for, each built only when configured and owning its routes (`GatehouseApplication.endpoints`):
///
/// - the authorization server face (authorize, callback, token, revoke, metadata, logout): always;
/// - sealed sessions (their tokens, `/userinfo`, session codes and web sessions, the sessions a
///   minting kind keeps): with a `sessions` section;
/// - app instances (registration, attestation, certification): when an app has `instances`;
/// - in-app sign-in (the authorization challenge endpoint): when an app has `in_app_sign_in: on`;
/// - the relay: with `routes`.
public struct Gatehouse: GatehouseFeature {
    let context: GatehouseContext
    let authorizationServer: AuthorizationServer
    let sealedSessions: SealedSessions?
    let appInstances: AppInstances?
    let inAppSignIn: InAppSignIn?
    let relayFace: RelayFace?
    /// The decision endpoint for the team's ingress (`forward_auth:`): the relay's admission, no data path.
    let forwardAuthFace: ForwardAuthFace?

    /// A Gatehouse; `previous` is the one a reload replaces: its in-process state (rate-limit
    /// buckets, replay caches, refreshes in flight) carries over, and so do the upstream profiles with theirs.
    public init(configuration: GatehouseConfiguration, store: any GatehouseStore,
                upstreams: [String: any UpstreamProfile], relay: RelayServices? = nil, sessions: SessionServices? = nil,
                signer: AssertionSigner? = nil, now: @escaping @Sendable () -> Date = Date.init, logger: Logger,
                audit: AuditLog = AuditLog(), previous: Gatehouse? = nil) {
        self.init(configuration: configuration, store: store, upstreams: upstreams, relay: relay, sessions: sessions, signer: signer,
                  now: now, logger: logger, audit: audit, previous: previous,
                  mailer: configuration.mail.map { SMTPMailer(settings: $0, logger: logger) })
    }

    /// The same, sending e-mail through `mailer` (the `mail:` relay in production; a recorder in tests).
    init(configuration: GatehouseConfiguration, store: any GatehouseStore, upstreams: [String: any UpstreamProfile],
         relay: RelayServices? = nil, sessions: SessionServices? = nil, signer: AssertionSigner? = nil,
         now: @escaping @Sendable () -> Date = Date.init, logger: Logger, audit: AuditLog = AuditLog(), previous: Gatehouse? = nil,
         mailer: (any Mailer)?) {
        let context = GatehouseContext(
            configuration: configuration, store: store, upstreams: upstreams, now: now, logger: logger, audit: audit,
            limits: RateLimiters(configuration.operations.rateLimits, audit: audit, previous: previous?.limits),
            dpop: DPoPEnforcement(configuration: configuration, store: store, now: now, previous: previous?.dpop),
            // Its settings come from `sessions`, which a reload never changes.
            passthrough: previous?.passthrough
                ?? PassthroughRefresher(store: store, configuration: configuration, now: now, logger: logger, audit: audit),
            signer: signer ?? relay?.signer)
        self.context = context
        let instances = configuration.clients.values.contains { $0.instances != nil } ? AppInstances(context: context, mailer: mailer) : nil
        let sealed = sessions.map { SealedSessions(context: context, services: $0, relay: relay, instances: instances) }
        appInstances = instances
        inAppSignIn = configuration.offersInAppSignIn ? InAppSignIn(context: context, mailer: mailer, instances: instances) : nil
        sealedSessions = sealed
        authorizationServer = AuthorizationServer(context: context, sessions: sealed, instances: instances, identityCache: relay?.cache)
        let relayFace = relay.map { RelayFace(context: context, services: $0, sealedSessions: sealed) }
        self.relayFace = relayFace
        forwardAuthFace = relayFace.flatMap { face in configuration.forwardAuth.map { ForwardAuthFace(relay: face, settings: $0) } }
    }

    public var configuration: GatehouseConfiguration { context.configuration }
    public var store: any GatehouseStore { context.store }
    public var upstreams: [String: any UpstreamProfile] { context.upstreams }
    public var now: @Sendable () -> Date { context.now }
    public var logger: Logger { context.logger }
    public var audit: AuditLog { context.audit }
    /// The token buckets of `rate_limits`.
    public var limits: RateLimiters { context.limits }
    public var signer: AssertionSigner? { context.signer }
    /// The resource relay's services; `nil` when no route is configured.
    public var relay: RelayServices? { relayFace?.services }
    /// Sealed sessions; `nil` without a `sessions` section.
    public var sessions: SessionServices? { sealedSessions?.services }
}
