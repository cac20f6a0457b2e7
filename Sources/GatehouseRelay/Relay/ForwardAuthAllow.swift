public import Foundation
public import GatehouseCore

/// What an allowed forward-auth decision tells the ingress, the same on both paths that answer
/// one (the general path's `ForwardAuthFace` and the fast path's planner): what the relay would
/// have set for the backend, and how long the ingress may keep the answer.
public enum ForwardAuthAllow {
    /// The allow's headers: each of the route's identity headers the caller has a value for,
    /// `Authorization` when the backend should get one (`authorization`: a whole header value),
    /// `Cache-Control` and nginx's `X-Accel-Expires`, and an empty body's `Content-Length`.
    public static func headers(route: RouteSettings, identity: CallerIdentity, authorization: String?, cacheSeconds: Int) -> [(String, String)] {
        var headers: [(String, String)] = []
        headers.reserveCapacity(route.identityHeaders.count + 4)
        for header in route.identityHeaders {
            if let value = identity.value(of: header.source) { headers.append((header.name, RelayHeaderPolicy.headerSafe(value))) }
        }
        if let authorization { headers.append(("Authorization", authorization)) }
        if cacheSeconds > 0 {
            headers.append(("Cache-Control", "private, max-age=\(cacheSeconds)"))
            headers.append(("X-Accel-Expires", String(cacheSeconds)))
        } else {
            headers.append(("Cache-Control", "no-store"))
            headers.append(("X-Accel-Expires", "0"))
        }
        headers.append(("Content-Length", "0"))
        return headers
    }

    /// How long an ingress may keep an allow: at most `maxAge`, the identity cache's lifetime and
    /// the identity's remaining life; never for a DPoP-bound token (a proof is spent once) or the
    /// session cookie (its CSRF check reads `Origin`, which an ingress's cache key does not hold).
    public static func cacheSeconds(scheme: RelayAdmission.Scheme, maxAge: Duration, cacheTTL: Duration?, expiresAt: Date?, now: Date) -> Int {
        guard scheme == .bearer else { return 0 }
        var seconds = Int(maxAge.components.seconds)
        if let cacheTTL { seconds = min(seconds, Int(cacheTTL.components.seconds)) }
        // Clamped before the conversion: an absurd `exp` is a long life, never a trap.
        if let expiresAt { seconds = min(seconds, Int(min(max(expiresAt.timeIntervalSince(now), 0), 86_400).rounded(.down))) }
        return max(0, seconds)
    }

    /// The `Authorization` value the backend gets: `replaced` (a sealed session's upstream token,
    /// or a signed assertion) as a bearer token; else the app's own header on a `passthrough`
    /// route that took a token from it; none on `remove` (or for a session cookie).
    public static func authorization(route: RouteSettings, replaced: String?, scheme: RelayAdmission.Scheme, appHeader: String?) -> String? {
        if let replaced { return "Bearer " + replaced }
        guard route.authorization == .passthrough, scheme != .cookie else { return nil }
        return appHeader
    }
}
