public import AsyncHTTPClient
public import Foundation
public import GatehouseCore
public import GatehouseRelay
public import GatehouseSessions
public import GatehouseUpstreams
public import Logging
import Synchronization

/// Everything that outlives a configuration, made once at start: every `Gatehouse`, the first
/// and each one a reload (SIGHUP) builds, is made from its configuration and this one value.
///
/// What lives here is what a reload may not change (the store, the upstreams' profiles, sealed
/// sessions, the mail relay, the signing key) and the state that must not start afresh with a new
/// file: the rate limits' token buckets (kept while a limit's settings stay), DPoP's replay cache,
/// proof-id writer and nonces, the refreshes of passthrough tokens in flight, the identity cache,
/// the identity resolvers (kept while `identity_concurrency` stays) and the backend client.
/// What a reload may change (clients, routes, rate limits) is read from the configuration only.
public final class GatehouseRuntime: Sendable {
    public let store: any GatehouseStore
    public let upstreams: [String: any UpstreamProfile]
    /// Sealed sessions; `nil` without a `sessions` section.
    public let sessions: SessionServices?
    /// Gatehouse's ES256 key: assertions toward backends, ID tokens toward sealed apps, `/.well-known/jwks.json`.
    public let signer: AssertionSigner?
    public let now: @Sendable () -> Date
    public let logger: Logger
    public let audit: AuditLog
    /// The relay's cache of callers' identities.
    public let identityCache: IdentityCache
    /// The `mail:` relay (or a recorder in tests); `nil` without one.
    let mailer: (any Mailer)?
    /// Refreshes of passthrough apps' upstream tokens, coordinated across instances.
    let passthrough: PassthroughRefresher
    let dpop: DPoPEnforcement.State
    let buckets: RateLimiters.Buckets
    /// The client identity services are asked through; `nil` when resolvers are given (tests).
    private let httpClient: HTTPClient?
    private let relayParts: Mutex<RelayParts>

    /// The relay's parts that are made when first needed and then kept.
    struct RelayParts {
        var backendClient: HTTPClient?
        /// The identity resolvers and the `identity_concurrency` they were made with.
        var resolvers: (concurrency: Int, resolvers: [String: any IdentityResolver])?
    }

    /// The runtime of a process started with `configuration`. `httpClient`: the process's client
    /// (identity services); `relay`: a relay's cache, resolvers and backend client to use instead
    /// of making them (tests); `mailer`: the `mail:` relay unless given.
    public convenience init(configuration: GatehouseConfiguration, store: any GatehouseStore, upstreams: [String: any UpstreamProfile],
                            httpClient: HTTPClient? = nil, relay: RelayServices? = nil, sessions: SessionServices? = nil,
                            signer: AssertionSigner? = nil, now: @escaping @Sendable () -> Date = Date.init, logger: Logger,
                            audit: AuditLog = AuditLog()) {
        self.init(configuration: configuration, store: store, upstreams: upstreams, httpClient: httpClient, relay: relay, sessions: sessions,
                  signer: signer, now: now, logger: logger, audit: audit,
                  mailer: configuration.mail.map { SMTPMailer(settings: $0, logger: logger) })
    }

    init(configuration: GatehouseConfiguration, store: any GatehouseStore, upstreams: [String: any UpstreamProfile],
         httpClient: HTTPClient? = nil, relay: RelayServices? = nil, sessions: SessionServices? = nil, signer: AssertionSigner? = nil,
         now: @escaping @Sendable () -> Date = Date.init, logger: Logger, audit: AuditLog = AuditLog(), mailer: (any Mailer)?) {
        self.store = store
        self.upstreams = upstreams
        self.sessions = sessions
        self.signer = signer ?? relay?.signer
        self.now = now
        self.logger = logger
        self.audit = audit
        self.mailer = mailer
        self.httpClient = httpClient
        identityCache = relay?.cache ?? IdentityCache(maximumEntries: configuration.identityCache.maximumEntries)
        // Its settings come from `sessions`, which a reload never changes.
        passthrough = PassthroughRefresher(store: store, configuration: configuration, now: now, logger: logger, audit: audit)
        dpop = DPoPEnforcement.State(configuration: configuration, store: store, now: now)
        buckets = RateLimiters.Buckets()
        relayParts = Mutex(RelayParts(
            backendClient: relay?.backendClient,
            resolvers: relay.map { (configuration.operations.rateLimits.identityConcurrency, $0.resolvers) }))
    }

    /// The relay's services for `configuration`; `nil` without routes, or without the means to
    /// ask identity services (a runtime made with neither an HTTP client nor a relay's parts).
    /// The backend client is made once, when routes first need it (at start, or by the reload
    /// that adds the first routes); the resolvers are kept unless `identity_concurrency` changed.
    func relayServices(for configuration: GatehouseConfiguration) -> RelayServices? {
        guard !configuration.routes.isEmpty else { return nil }
        let concurrency = configuration.operations.rateLimits.identityConcurrency
        let made: (backendClient: HTTPClient, resolvers: [String: any IdentityResolver])? = relayParts.withLock { parts in
            guard httpClient != nil || parts.resolvers != nil else { return nil }
            let client = parts.backendClient ?? RelayServices.makeBackendClient(for: configuration)
            parts.backendClient = client
            if let kept = parts.resolvers, kept.concurrency == concurrency || httpClient == nil { return (client, kept.resolvers) }
            let resolvers = httpClient.map { configuration.identityResolvers(client: $0) } ?? [:]
            parts.resolvers = (concurrency, resolvers)
            return (client, resolvers)
        }
        guard let made else { return nil }
        return RelayServices(configuration: configuration, cache: identityCache, resolvers: made.resolvers,
                             backendClient: made.backendClient, signer: signer)
    }

    /// The backend client, when routes made one.
    public var backendClient: HTTPClient? { relayParts.withLock { $0.backendClient } }

    /// Shuts down what the runtime made (the backend client); the store and the HTTP client it was
    /// given are their owner's to close.
    public func shutdown() async throws {
        try await backendClient?.shutdown()
    }
}
