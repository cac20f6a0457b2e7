public import CoreMetrics
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
///
/// Every lookup is counted (`IdentityCacheMetrics`): `peek` counts the live identities it finds;
/// what it does not find is counted when the general path resolves the token.
public final class IdentityCache: Sendable {
    private let state: Mutex<LRUState>
    private let clock: @Sendable () -> Int64
    private let metrics: IdentityCacheMetrics

    /// - Parameters:
    ///   - now: milliseconds on a monotonic clock (tests move it by hand).
    ///   - metrics: `nil`: the process's `MetricsSystem`, which must be bootstrapped before the
    ///     cache is made (its handles are made here, once); tests hand in their own factory.
    public init(maximumEntries: Int, now: (@Sendable () -> Int64)? = nil, metrics: (any MetricsFactory)? = nil) {
        self.state = Mutex(LRUState(capacity: max(1, maximumEntries)))
        self.clock = now ?? IdentityCache.monotonicMilliseconds
        self.metrics = IdentityCacheMetrics(factory: metrics)
    }

    /// The identity for `token`: from the cache, or from `resolver` (once, however many ask).
    public func resolve(token: String, upstream: String, ttl: Duration, negativeTTL: Duration, resolver: any IdentityResolver)
        async throws(IdentityUnavailable) -> IdentityResolution
    {
        let key = TokenKey(token: token, upstream: upstream)
        let now = clock()
        let lookup: Lookup = state.withLock { state in
            if let hit = get(key, now: now, in: &state) { return .hit(hit) }
            if let task = state.inflight[key] { return .join(task) }
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
            return .call(task)
        }
        switch lookup {
        case .hit(let resolution):
            metrics.countHit(resolution)
            return resolution
        case .join(let task):
            metrics.coalesced.increment()
            return try await task.value.get()
        case .call(let task):
            metrics.misses.increment()
            return try await task.value.get()
        }
    }

    /// The cached resolution of `token`, without asking anyone (the relay's event-loop fast path).
    /// A live identity is counted as a hit; a rejected token or none is counted when the general
    /// path resolves it (the fast path declines both).
    /// `counting: false` for a look that is not the request's look-up (the general path resolves
    /// the token next and counts it then).
    public func peek(token: String, upstream: String, counting: Bool = true) -> IdentityResolution? {
        peek(key: TokenKey(token: token, upstream: upstream), counting: counting)
    }

    /// `peek(token:upstream:)` for a key worked out before (the fast path keeps its connection's last one).
    public func peek(key: TokenKey, counting: Bool = true) -> IdentityResolution? {
        let now = clock()
        let found = state.withLock { get(key, now: now, in: &$0) }
        if counting, case .active? = found { metrics.hits.increment() }
        return found
    }

    /// Drops the entry of a token (revoked, or its session ended).
    public func invalidate(token: String, upstream: String) {
        invalidate(key: TokenKey(token: token, upstream: upstream))
    }

    public func invalidate(key: TokenKey) {
        state.withLock { state in
            state.remove(key)
            metrics.entries.record(state.index.count)
        }
    }

    /// How many entries the cache holds.
    public var count: Int { state.withLock { $0.index.count } }

    /// Fills the cache directly, for measuring its memory (`gatehouse bench-identity-cache`).
    public func insert(_ resolution: IdentityResolution, forToken token: String, upstream: String, ttl: Duration) {
        let key = TokenKey(token: token, upstream: upstream)
        let expiry = clock() + ttl.inMilliseconds
        state.withLock { set(key, resolution, expiry: expiry, in: &$0) }
    }

    private func finish(_ key: TokenKey, _ result: Result<IdentityResolution, IdentityUnavailable>, ttl: Duration, negativeTTL: Duration) {
        let now = clock()
        state.withLock { state in
            state.inflight[key] = nil
            switch result {
            case .success(.active(let identity)):
                var expiry = now + ttl.inMilliseconds
                if let expiresAt = identity.expiresAt {
                    // Clamped before the conversion: an absurd `exp` (1e300) is a long life, never a trap.
                    let remaining = min(max(expiresAt.timeIntervalSinceNow * 1000, -1), Double(ttl.inMilliseconds))
                    expiry = min(expiry, now + Int64(remaining))
                }
                if expiry > now { set(key, .active(identity), expiry: expiry, in: &state) }
            case .success(.inactive):
                if negativeTTL > .zero { set(key, .inactive, expiry: now + negativeTTL.inMilliseconds, in: &state) }
            case .failure:
                break
            }
        }
    }

    /// A live entry; an expired one is dropped (and the entry count follows).
    private func get(_ key: TokenKey, now: Int64, in state: inout LRUState) -> IdentityResolution? {
        let count = state.index.count
        let value = state.get(key, now: now)
        if state.index.count != count { metrics.entries.record(state.index.count) }
        return value
    }

    private func set(_ key: TokenKey, _ value: IdentityResolution, expiry: Int64, in state: inout LRUState) {
        if state.set(key, value, expiry: expiry) { metrics.evictions.increment() }
        metrics.entries.record(state.index.count)
    }

    private enum Lookup {
        case hit(IdentityResolution)
        /// A call for this token is under way: wait for its answer.
        case join(Task<Result<IdentityResolution, IdentityUnavailable>, Never>)
        /// This lookup made the call.
        case call(Task<Result<IdentityResolution, IdentityUnavailable>, Never>)
    }

    @Sendable private static func monotonicMilliseconds() -> Int64 {
        Int64(DispatchTime.now().uptimeNanoseconds / 1_000_000)
    }
}
