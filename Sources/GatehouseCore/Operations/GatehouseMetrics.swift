public import CoreMetrics
import Synchronization

/// Every metric Gatehouse exports, named in one place (docs/operations.md). The process's
/// `MetricsSystem` is bootstrapped with Prometheus by `serve`; elsewhere (tests, admin
/// commands) these are swift-metrics' no-op handles.
///
/// Handles with labels are made once per label set and kept (`HandleCache`): a request never
/// goes through the metrics factory.
public enum GatehouseMetrics {
    public static let requestsTotal = "gatehouse_http_requests_total"
    public static let requestDuration = "gatehouse_http_request_duration_seconds"
    public static let relayRequestsTotal = "gatehouse_relay_requests_total"
    public static let upstreamRequestsTotal = "gatehouse_upstream_requests_total"
    public static let upstreamRequestDuration = "gatehouse_upstream_request_duration_seconds"
    public static let refreshesTotal = "gatehouse_refreshes_total"
    public static let identityCacheLookupsTotal = "gatehouse_identity_cache_lookups_total"
    public static let identityCacheEvictionsTotal = "gatehouse_identity_cache_evictions_total"
    public static let identityCacheEntries = "gatehouse_identity_cache_entries"
    public static let storeQueryDuration = "gatehouse_store_query_duration_seconds"
    public static let storeConnectionsInUse = "gatehouse_store_connections_in_use"
    public static let storeLeaseWaitsTotal = "gatehouse_store_lease_waits_total"
    public static let rateLimitedTotal = "gatehouse_rate_limited_total"
    public static let auditEventsTotal = "gatehouse_audit_events_total"
    public static let instancesStored = "gatehouse_instances"
    public static let accessLogLinesDroppedTotal = "gatehouse_access_log_lines_dropped_total"

    /// Each metric's `# HELP` text.
    public static let help: [String: String] = [
        requestsTotal: "Requests answered, by route template, method and status class.",
        requestDuration: "Time from request head to answer head, by route template.",
        relayRequestsTotal: "Relayed requests, by route and by relay path (fast or general).",
        upstreamRequestsTotal: "Calls to upstreams, by upstream, endpoint and outcome.",
        upstreamRequestDuration: "Duration of calls to upstreams, by upstream and endpoint.",
        refreshesTotal: "Refresh-token grants, by outcome.",
        identityCacheLookupsTotal: "Identity cache look-ups, by result.",
        identityCacheEvictionsTotal: "Identities evicted from the cache to make room.",
        identityCacheEntries: "Identities in the cache.",
        storeQueryDuration: "Duration of store queries, by store.",
        storeConnectionsInUse: "Store connections in use, by store.",
        storeLeaseWaitsTotal: "Store queries that waited for a connection, by store.",
        rateLimitedTotal: "Requests refused by a rate limit, by limit.",
        auditEventsTotal: "Audit events written, by event.",
        instancesStored: "Registered app instance rows in the store (expired ones until swept), read at each sweep.",
        accessLogLinesDroppedTotal: "Access log lines dropped, whole, because standard error did not take them.",
    ]

    /// Histogram buckets of every duration metric, in seconds.
    public static let durationBuckets: [Duration] = [
        .microseconds(1000), .microseconds(2500), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .microseconds(2_500_000), .seconds(5), .seconds(10),
    ]

    /// Outcomes of a call to an upstream (`gatehouse_upstream_requests_total{outcome}`).
    public enum Outcome: String, Sendable {
        case ok, invalid_grant, clientError = "4xx", serverError = "5xx", timeout, unreachable, tls
    }

    /// Refresh outcomes (`gatehouse_refreshes_total{outcome}`).
    public enum RefreshOutcome: String, Sendable, CaseIterable {
        case performed, coalesced, failed, reuse_detected, family_revoked
    }

    /// Which limit answered 429/503 (`gatehouse_rate_limited_total{limit}`).
    public enum Limit: String, Sendable, CaseIterable {
        case oauth_client, oauth_address, relay_subject, identity_address, identity_concurrency, upstream_backoff
        case registration_address, registration_app, registration_pending, unknown_refresh_address
        case in_app_address, in_app_account
        /// In-app passwords refused for an account beyond `accounts_per_address` or `accounts_per_instance`;
        /// dialogues asked for an e-mailed code because the wrong-password breaker is tripped.
        case in_app_accounts_per_address, in_app_accounts_per_instance, in_app_breaker
    }

    public static func refresh(_ outcome: RefreshOutcome) {
        refreshCounters.handle(for: outcome.rawValue) { Counter(label: refreshesTotal, dimensions: [("outcome", $0)]) }.increment()
    }

    public static func rateLimited(_ limit: Limit) {
        limitCounters.handle(for: limit.rawValue) { Counter(label: rateLimitedTotal, dimensions: [("limit", $0)]) }.increment()
    }

    public static func audit(_ event: String) {
        auditCounters.handle(for: event) { Counter(label: auditEventsTotal, dimensions: [("event", $0)]) }.increment()
    }

    private static let refreshCounters = HandleCache<String, Counter>()
    private static let limitCounters = HandleCache<String, Counter>()
    private static let auditCounters = HandleCache<String, Counter>()
}

/// Metric handles by label set, made on first use and kept.
public final class HandleCache<Key: Hashable & Sendable, Handle: Sendable>: Sendable {
    private let handles = Mutex<[Key: Handle]>([:])

    public init() {}

    public func handle(for key: Key, make: (Key) -> Handle) -> Handle {
        handles.withLock { handles in
            if let handle = handles[key] { return handle }
            let handle = make(key)
            handles[key] = handle
            return handle
        }
    }
}
