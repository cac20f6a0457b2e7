public import GatehouseCore
public import HTTPTypes

/// The token buckets of `rate_limits`, one set per process (in-process limits: each instance
/// counts on its own). A reload keeps a limiter whose settings did not change, so a new file
/// does not hand every client a fresh burst.
public final class RateLimiters: Sendable {
    public let settings: RateLimitSettings
    public let oauthPerClient: TokenBucketLimiter?
    public let oauthPerAddress: TokenBucketLimiter?
    public let relayPerSubject: TokenBucketLimiter?
    public let identityLookupsPerAddress: TokenBucketLimiter?
    public let registrationPerAddress: TokenBucketLimiter?
    public let registrationPerApp: TokenBucketLimiter?
    public let unknownRefreshPerAddress: TokenBucketLimiter?

    public init(_ settings: RateLimitSettings, previous: RateLimiters? = nil) {
        self.settings = settings
        func limiter(_ key: KeyPath<RateLimitSettings, BucketSettings?>, _ old: KeyPath<RateLimiters, TokenBucketLimiter?>) -> TokenBucketLimiter? {
            guard let bucket = settings[keyPath: key] else { return nil }
            if let previous, previous.settings[keyPath: key] == bucket, let kept = previous[keyPath: old] { return kept }
            return TokenBucketLimiter(bucket)
        }
        oauthPerClient = limiter(\.oauthPerClient, \.oauthPerClient)
        oauthPerAddress = limiter(\.oauthPerAddress, \.oauthPerAddress)
        relayPerSubject = limiter(\.relayPerSubject, \.relayPerSubject)
        identityLookupsPerAddress = limiter(\.identityLookupsPerAddress, \.identityLookupsPerAddress)
        registrationPerAddress = limiter(\.registrationPerAddress, \.registrationPerAddress)
        registrationPerApp = limiter(\.registrationPerApp, \.registrationPerApp)
        unknownRefreshPerAddress = limiter(\.unknownRefreshPerAddress, \.unknownRefreshPerAddress)
    }

    /// The client's address as the limits count it: the peer, or what a trusted proxy says the
    /// client was; an IPv6 address by its /64 (`ClientAddress.bucketKey`).
    public func clientAddress(peer: String?, headers: HTTPFields) -> String? {
        // Several lines of one field are one list (RFC 9110 §5.3): the last proxy's hop is last.
        ClientAddress.resolve(peer: peer, forwardedFor: joined(headers, Self.forwardedFor), forwarded: joined(headers, Self.forwarded),
                              trusted: settings.trustedProxies, header: settings.forwardedHeader).map(ClientAddress.bucketKey)
    }

    private func joined(_ headers: HTTPFields, _ name: HTTPField.Name) -> String? {
        let values = headers[values: name]
        return values.isEmpty ? nil : values.joined(separator: ",")
    }

    static let forwardedFor = HTTPField.Name("X-Forwarded-For")!
    static let forwarded = HTTPField.Name("Forwarded")!
}
