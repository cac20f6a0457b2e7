public import Foundation
import Crypto
public import GatehouseCore
public import GatehouseUpstreams
public import Logging
public import GatehouseRelay
public import GatehouseSessions

/// The decisions behind Gatehouse's endpoints, with everything they need handed in:
/// configuration, store, one client per upstream, a clock and a logger.
public struct Gatehouse: Sendable {
    public let configuration: GatehouseConfiguration
    public let store: any GatehouseStore
    public let upstreams: [String: any UpstreamProfile]
    public let now: @Sendable () -> Date
    public let logger: Logger
    /// The resource relay's services; `nil` when no route is configured.
    public let relay: RelayServices?
    /// Sealed sessions; `nil` when no client is sealed.
    public let sessions: SessionServices?
    /// Refreshes of passthrough apps' upstream tokens, coordinated across instances.
    let passthrough: PassthroughRefresher
    /// Gatehouse's ES256 key: assertions toward backends, ID tokens toward sealed apps, `/.well-known/jwks.json`.
    public let signer: AssertionSigner?
    /// Magic links sent per mailbox and per client address, per `central` upstream with `app_api`.
    let magicLinkLimiters: [String: MagicLinkLimiter]
    /// The token buckets of `rate_limits`.
    public let limits: RateLimiters
    /// Security events (sign-ins, refreshes, revocations …).
    public let audit: AuditLog
    /// DPoP proof ids seen lately (RFC 9449 §11.1); the store keeps them for the other instances.
    let dpopReplays: DPoPReplayCache
    /// Server nonces for DPoP proofs, the same on every instance sharing the session key ring.
    let dpopNonces: DPoPNonces
    /// The SMTP relay of manual certification codes (`mail:`).
    let mailer: (any Mailer)?

    /// A Gatehouse; `previous` is the one a reload replaces: its in-process state (rate-limit
    /// buckets, magic-link counts, Apple tokens taken, refreshes in flight) carries over.
    public init(configuration: GatehouseConfiguration, store: any GatehouseStore,
                upstreams: [String: any UpstreamProfile], relay: RelayServices? = nil, sessions: SessionServices? = nil,
                signer: AssertionSigner? = nil, now: @escaping @Sendable () -> Date = Date.init, logger: Logger,
                audit: AuditLog = AuditLog(), previous: Gatehouse? = nil) {
        self.signer = signer ?? relay?.signer
        self.configuration = configuration
        self.store = store
        self.upstreams = upstreams
        self.relay = relay
        self.sessions = sessions
        self.now = now
        self.logger = logger
        self.audit = audit
        self.limits = RateLimiters(configuration.operations.rateLimits, previous: previous?.limits)
        self.magicLinkLimiters = previous?.magicLinkLimiters ?? upstreams.compactMapValues { profile in
            (profile as? CentralUpstream).map {
                MagicLinkLimiter(mailboxLimit: $0.central.magicLinkLimit, addressLimit: $0.central.magicLinkAddressLimit)
            }
        }
        self.mailer = configuration.mail.map { SMTPMailer(settings: $0, logger: logger) }
        self.dpopReplays = previous?.dpopReplays ?? DPoPReplayCache(maximumEntries: configuration.dpop.replayCacheEntries)
        let nonceKey = configuration.sessions?.keyRing.derivedSecrets(purpose: "gatehouse dpop-nonce v1").first
            .map { SymmetricKey(data: $0) } ?? SymmetricKey(size: .bits256)
        self.dpopNonces = previous?.dpopNonces ?? DPoPNonces(key: nonceKey, lifetime: configuration.dpop.proofLifetime.inSeconds * 2)
        // Its settings come from `sessions`, which a reload never changes.
        self.passthrough = previous?.passthrough ?? PassthroughRefresher(store: store, configuration: configuration, now: now, logger: logger, audit: audit)
    }

    /// The issuer identifier: the public base URL (RFC 8414 §2).
    var issuer: String { configuration.server.publicBaseURL }

    func expiry(after lifetime: Duration) -> Date {
        let (seconds, attoseconds) = lifetime.components
        return now().addingTimeInterval(Double(seconds) + Double(attoseconds) / 1e18)
    }
}
