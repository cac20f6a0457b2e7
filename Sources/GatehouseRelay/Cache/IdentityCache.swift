import Foundation
public import GatehouseCore
import Synchronization

/// The caller-identity cache: bounded, least recently used evicted, keyed by `TokenKey`.
///
/// - An entry lives for min(TTL, the token's own expiry).
/// - Concurrent misses for one token make exactly one identity call (single flight); every
///   waiter gets its answer.
/// - A token the identity service rejected is remembered for `negativeTTL`, so an app that
///   retries cannot hammer the service.
/// - An identity service outage is never cached.
public final class IdentityCache: Sendable {
    private let state: Mutex<LRUState>
    private let clock: @Sendable () -> Int64

    /// - Parameter now: milliseconds on a monotonic clock (tests move it by hand).
    public init(maximumEntries: Int, now: (@Sendable () -> Int64)? = nil) {
        self.state = Mutex(LRUState(capacity: max(1, maximumEntries)))
        self.clock = now ?? IdentityCache.monotonicMilliseconds
    }

    /// The identity for `token`: from the cache, or from `resolver` (once, however many ask).
    public func resolve(token: String, upstream: String, ttl: Duration, negativeTTL: Duration, resolver: any IdentityResolver)
        async throws(IdentityUnavailable) -> IdentityResolution
    {
        let key = TokenKey(token: token, upstream: upstream)
        let now = clock()
        let lookup: Lookup = state.withLock { state in
            if let hit = state.get(key, now: now) { return .hit(hit) }
            if let task = state.inflight[key] { return .wait(task) }
            let task = Task<Result<IdentityResolution, IdentityUnavailable>, Never> {
                let result: Result<IdentityResolution, IdentityUnavailable>
                do throws(IdentityUnavailable) {
                    result = .success(try await resolver.resolve(token: token))
                } catch {
                    result = .failure(error)
                }
                self.finish(key, result, ttl: ttl, negativeTTL: negativeTTL)
                return result
            }
            state.inflight[key] = task
            return .wait(task)
        }
        switch lookup {
        case .hit(let resolution):
            return resolution
        case .wait(let task):
            return try await task.value.get()
        }
    }

    /// The cached resolution of `token`, without asking anyone (the relay's event-loop fast path).
    public func peek(token: String, upstream: String) -> IdentityResolution? {
        let key = TokenKey(token: token, upstream: upstream)
        let now = clock()
        return state.withLock { $0.get(key, now: now) }
    }

    /// Drops the entry of a token (revoked, or its session ended).
    public func invalidate(token: String, upstream: String) {
        invalidate(key: TokenKey(token: token, upstream: upstream))
    }

    public func invalidate(key: TokenKey) {
        state.withLock { $0.remove(key) }
    }

    /// How many entries the cache holds.
    public var count: Int { state.withLock { $0.index.count } }

    /// Fills the cache directly, for measuring its memory (`gatehouse bench-identity-cache`).
    public func insert(_ resolution: IdentityResolution, forToken token: String, upstream: String, ttl: Duration) {
        let key = TokenKey(token: token, upstream: upstream)
        let expiry = clock() + ttl.inMilliseconds
        state.withLock { $0.set(key, resolution, expiry: expiry) }
    }

    private func finish(_ key: TokenKey, _ result: Result<IdentityResolution, IdentityUnavailable>, ttl: Duration, negativeTTL: Duration) {
        let now = clock()
        state.withLock { state in
            state.inflight[key] = nil
            switch result {
            case .success(.active(let identity)):
                var expiry = now + ttl.inMilliseconds
                if let expiresAt = identity.expiresAt {
                    expiry = min(expiry, now + Int64(expiresAt.timeIntervalSinceNow * 1000))
                }
                if expiry > now { state.set(key, .active(identity), expiry: expiry) }
            case .success(.inactive):
                if negativeTTL > .zero { state.set(key, .inactive, expiry: now + negativeTTL.inMilliseconds) }
            case .failure:
                break
            }
        }
    }

    private enum Lookup {
        case hit(IdentityResolution)
        case wait(Task<Result<IdentityResolution, IdentityUnavailable>, Never>)
    }

    @Sendable private static func monotonicMilliseconds() -> Int64 {
        Int64(DispatchTime.now().uptimeNanoseconds / 1_000_000)
    }
}
