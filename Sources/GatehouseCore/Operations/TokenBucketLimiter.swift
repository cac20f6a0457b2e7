import Synchronization

/// Token buckets by key (a client id, an address, a subject): `burst` at once, refilled at
/// `perSecond`. In process: each instance counts on its own. At most `maximumKeys` buckets are
/// kept; past that, full buckets (idle keys) are dropped first.
public final class TokenBucketLimiter: Sendable {
    public let settings: BucketSettings
    private let maximumKeys: Int
    private let buckets: Mutex<[String: Bucket]>

    struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    public init(_ settings: BucketSettings, maximumKeys: Int = 100_000) {
        self.settings = settings
        self.maximumKeys = maximumKeys
        self.buckets = Mutex([:])
    }

    /// Takes one token for `key`: `nil` when allowed, else how long until a token is back.
    public func take(_ key: String, now: ContinuousClock.Instant = .now) -> Duration? {
        let rate = settings.perSecond
        let burst = Double(settings.burst)
        return buckets.withLock { buckets in
            if buckets.count >= maximumKeys, buckets[key] == nil { Self.prune(&buckets, now: now, rate: rate, burst: burst, limit: maximumKeys) }
            var bucket = buckets[key] ?? Bucket(tokens: burst, updated: now)
            bucket.tokens = min(burst, bucket.tokens + Self.seconds(now - bucket.updated) * rate)
            bucket.updated = now
            defer { buckets[key] = bucket }
            guard bucket.tokens >= 1 else { return .milliseconds(Int64(((1 - bucket.tokens) / rate * 1000).rounded(.up))) }
            bucket.tokens -= 1
            return nil
        }
    }

    /// Keys currently tracked (for tests).
    public var count: Int { buckets.withLock { $0.count } }

    private static func prune(_ buckets: inout [String: Bucket], now: ContinuousClock.Instant, rate: Double, burst: Double, limit: Int) {
        buckets = buckets.filter { $0.value.tokens + seconds(now - $0.value.updated) * rate < burst }
        if buckets.count >= limit * 9 / 10 {
            // Still crowded by busy keys: forget half of them (they start again with a full bucket).
            for key in buckets.keys.prefix(buckets.count / 2 + 1) { buckets[key] = nil }
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}

extension Duration {
    /// Whole seconds, rounded up, at least 1: the value of a `Retry-After` header.
    public var retryAfterSeconds: Int {
        let (seconds, attoseconds) = components
        return max(1, Int(seconds) + (attoseconds > 0 ? 1 : 0))
    }
}
