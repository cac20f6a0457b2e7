public import GatehouseCore
public import HTTPTypes
import Synchronization

/// The token buckets of `rate_limits`, one set per process (in-process limits: each instance
/// counts on its own), and the one door every limit goes through: `take` takes from a bucket and,
/// when it refuses, counts the refusal (`gatehouse_rate_limited_total`) and audits it
/// (`rate_limited`), whichever face asked (the `/oauth/*` middleware, registration, refreshes
/// of unknown tokens, both relay paths). A reload keeps a limiter whose settings did not change,
/// so a new file does not hand every client a fresh burst.
public final class RateLimiters: Sendable {
    public let settings: RateLimitSettings
    let audit: AuditLog
    public let oauthPerClient: TokenBucketLimiter?
    public let oauthPerAddress: TokenBucketLimiter?
    public let relayPerSubject: TokenBucketLimiter?
    public let identityLookupsPerAddress: TokenBucketLimiter?
    public let registrationPerAddress: TokenBucketLimiter?
    public let registrationPerApp: TokenBucketLimiter?
    public let unknownRefreshPerAddress: TokenBucketLimiter?
    public let inAppPerAddress: TokenBucketLimiter?
    public let inAppPerAccount: TokenBucketLimiter?

    /// The limiters of `settings`, each taken from `buckets` (what outlives a configuration): a
    /// reload keeps a limiter whose settings did not change, so a new file does not hand every
    /// client a fresh burst.
    public init(_ settings: RateLimitSettings, audit: AuditLog = AuditLog(), buckets: Buckets = Buckets()) {
        self.settings = settings
        self.audit = audit
        func limiter(_ limit: GatehouseMetrics.Limit, _ key: KeyPath<RateLimitSettings, BucketSettings?>) -> TokenBucketLimiter? {
            buckets.limiter(limit, settings: settings[keyPath: key])
        }
        oauthPerClient = limiter(.oauth_client, \.oauthPerClient)
        oauthPerAddress = limiter(.oauth_address, \.oauthPerAddress)
        relayPerSubject = limiter(.relay_subject, \.relayPerSubject)
        identityLookupsPerAddress = limiter(.identity_address, \.identityLookupsPerAddress)
        registrationPerAddress = limiter(.registration_address, \.registrationPerAddress)
        registrationPerApp = limiter(.registration_app, \.registrationPerApp)
        unknownRefreshPerAddress = limiter(.unknown_refresh_address, \.unknownRefreshPerAddress)
        inAppPerAddress = limiter(.in_app_address, \.inAppPerAddress)
        inAppPerAccount = limiter(.in_app_account, \.inAppPerAccount)
    }

    /// The token buckets of every limit, by limit, outliving configurations: a limit whose
    /// settings are those of its kept limiter gets it back, with its buckets as they are; a limit
    /// a configuration turns off is forgotten (turned on again, it starts full).
    public final class Buckets: Sendable {
        private let limiters = Mutex<[GatehouseMetrics.Limit: TokenBucketLimiter]>([:])

        public init() {}

        func limiter(_ limit: GatehouseMetrics.Limit, settings: BucketSettings?) -> TokenBucketLimiter? {
            limiters.withLock { limiters in
                guard let settings else {
                    limiters[limit] = nil
                    return nil
                }
                if let kept = limiters[limit], kept.settings == settings { return kept }
                let made = TokenBucketLimiter(settings)
                limiters[limit] = made
                return made
            }
        }
    }

    /// The bucket of a limit, when configured (`registration_pending`, the upstream and identity
    /// limits and the in-app sign-in's store-backed limits are counted here but are no token bucket).
    func bucket(_ limit: GatehouseMetrics.Limit) -> TokenBucketLimiter? {
        switch limit {
        case .oauth_client: oauthPerClient
        case .oauth_address: oauthPerAddress
        case .relay_subject: relayPerSubject
        case .identity_address: identityLookupsPerAddress
        case .registration_address: registrationPerAddress
        case .registration_app: registrationPerApp
        case .unknown_refresh_address: unknownRefreshPerAddress
        case .in_app_address: inAppPerAddress
        case .in_app_account: inAppPerAccount
        case .identity_concurrency, .upstream_backoff, .registration_pending: nil
        case .in_app_accounts_per_address, .in_app_accounts_per_instance, .in_app_breaker: nil
        }
    }

    /// Takes one token of `limit` for `key`: `nil` to go on (or when the limit is not configured),
    /// else the wait before a token is there again. A refusal is counted and audited unless
    /// `recording` is false (the fast relay path, which declines and lets the general path refuse).
    func take(_ limit: GatehouseMetrics.Limit, key: String, clientID: String? = nil, subject: String? = nil,
              recording: Bool = true) -> Duration? {
        guard let wait = bucket(limit)?.take(key) else { return nil }
        if recording { refused(limit, clientID: clientID, subject: subject) }
        return wait
    }

    /// Counts and audits one request refused by a limit.
    func refused(_ limit: GatehouseMetrics.Limit, clientID: String?, subject: String?) {
        GatehouseMetrics.rateLimited(limit)
        audit.record(.rate_limited, clientID: clientID, subject: subject, reason: limit.rawValue)
    }

    /// The key `relay_per_subject` counts under: the caller's subject, else its bpid, else its
    /// token's hash (an identity service that names nobody still gets one bucket per token).
    /// The same on both relay paths, so the fast path declines exactly when the general path refuses.
    static func relaySubjectKey(_ identity: CallerIdentity, token: String) -> String {
        if let subject = identity.subject { return "sub:" + subject }
        if let bpid = identity.bpid { return "bpid:" + bpid }
        return "token:" + SecureToken.hash(token)
    }

    /// The client's address as the limits count it: the peer, or what a trusted proxy says the
    /// client was; an IPv6 address by its /64 (`ClientAddress.bucketKey`).
    public func clientAddress(peer: String?, headers: HTTPFields) -> String? {
        resolvedClientAddress(peer: peer, headers: headers).map(ClientAddress.bucketKey)
    }

    /// The client's address itself (an IPv6 address whole): what an upstream that protects
    /// accounts by address is told.
    public func resolvedClientAddress(peer: String?, headers: HTTPFields) -> String? {
        // Several lines of one field are one list (RFC 9110 §5.3): the last proxy's hop is last.
        ClientAddress.resolve(peer: peer, forwardedFor: joined(headers, Self.forwardedFor), forwarded: joined(headers, Self.forwarded),
                              trusted: settings.trustedProxies, header: settings.forwardedHeader)
    }

    private func joined(_ headers: HTTPFields, _ name: HTTPField.Name) -> String? {
        let values = headers[values: name]
        return values.isEmpty ? nil : values.joined(separator: ",")
    }

    static let forwardedFor = HTTPField.Name("X-Forwarded-For")!
    static let forwarded = HTTPField.Name("Forwarded")!
}
