public import Foundation

/// When an upstream access token is due for a refresh.
///
/// The configured skew is bounded by half the token's lifetime: with a 60-second token and a
/// 60-second skew, a token refreshed a moment ago would otherwise be due at once, and every
/// request would refresh it (some upstreams' access tokens live 60 s). A token is therefore
/// refreshed at most once per half of its lifetime, never right after it was issued.
public enum RefreshSchedule {
    /// The skew that applies to a token of `lifetime` seconds (`nil`: the upstream did not say).
    public static func effectiveSkew(configured: Duration, lifetime: Double?) -> Double {
        guard let lifetime, lifetime > 0 else { return configured.inSeconds }
        return min(configured.inSeconds, lifetime / 2)
    }

    public static func isDue(expiresAt: Date?, lifetime: Double?, skew: Duration, now: Date) -> Bool {
        guard let expiresAt else { return false }
        return expiresAt.timeIntervalSince(now) <= effectiveSkew(configured: skew, lifetime: lifetime)
    }
}
