public import CoreMetrics
import GatehouseCore

/// The identity cache's metric handles, made once with the cache: the relay's fast path only
/// increments them (an atomic add each, no lookup, no allocation).
///
/// `gatehouse_identity_cache_lookups_total{result}`: `hit` (a live identity), `negative_hit` (a
/// token the service rejected, remembered), `miss` (an identity call made), `coalesced` (joined a
/// call already under way for the same token); `gatehouse_identity_cache_evictions_total` (least
/// recently used entries dropped for room); `gatehouse_identity_cache_entries`.
struct IdentityCacheMetrics: Sendable {
    let hits: Counter
    let negativeHits: Counter
    let misses: Counter
    let coalesced: Counter
    let evictions: Counter
    let entries: Gauge

    /// - Parameter factory: `nil`: the process's `MetricsSystem` (bootstrapped before the cache is made).
    init(factory: (any MetricsFactory)?) {
        let factory = factory ?? MetricsSystem.factory
        func lookups(_ result: String) -> Counter {
            Counter(label: GatehouseMetrics.identityCacheLookupsTotal, dimensions: [("result", result)], factory: factory)
        }
        hits = lookups("hit")
        negativeHits = lookups("negative_hit")
        misses = lookups("miss")
        coalesced = lookups("coalesced")
        evictions = Counter(label: GatehouseMetrics.identityCacheEvictionsTotal, factory: factory)
        entries = Gauge(label: GatehouseMetrics.identityCacheEntries, factory: factory)
    }

    /// A value found in the cache.
    func countHit(_ resolution: IdentityResolution) {
        if case .active = resolution { hits.increment() } else { negativeHits.increment() }
    }
}
