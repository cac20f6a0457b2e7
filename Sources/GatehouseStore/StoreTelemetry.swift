import GatehouseCore
import Metrics
import Synchronization

/// The store's metrics, taken at the one place each store runs its queries:
/// `gatehouse_store_query_duration_seconds{store}` (waiting for a connection included),
/// `gatehouse_store_connections_in_use{store}` and `gatehouse_store_lease_waits_total{store}`.
///
/// A query in flight holds a connection when fewer than `poolSize` are in use, and waits for
/// one otherwise (SQLite: its one connection, which serialises the queries; PostgreSQL: the
/// pool, whose client does not say when it makes a caller wait). Handles are made once.
final class StoreTelemetry: Sendable {
    /// The `store` label: `sqlite` or `postgres`.
    let store: String
    /// Connections the store may use at once; `nil` when unknown (no waits counted).
    let poolSize: Int?
    private let inFlight = Atomic(0)
    private let duration: Timer
    private let inUse: Meter
    private let leaseWaits: Counter

    /// `factory`: where the handles come from; `nil`, the process's `MetricsSystem` (tests hand in their own).
    init(store: String, poolSize: Int?, factory: (any MetricsFactory)? = nil) {
        self.store = store
        self.poolSize = poolSize
        let dimensions = [("store", store)]
        if let factory {
            duration = Timer(label: GatehouseMetrics.storeQueryDuration, dimensions: dimensions, factory: factory)
            inUse = Meter(label: GatehouseMetrics.storeConnectionsInUse, dimensions: dimensions, factory: factory)
            leaseWaits = Counter(label: GatehouseMetrics.storeLeaseWaitsTotal, dimensions: dimensions, factory: factory)
        } else {
            duration = Timer(label: GatehouseMetrics.storeQueryDuration, dimensions: dimensions)
            inUse = Meter(label: GatehouseMetrics.storeConnectionsInUse, dimensions: dimensions)
            leaseWaits = Counter(label: GatehouseMetrics.storeLeaseWaitsTotal, dimensions: dimensions)
        }
    }

    /// Runs one query (`body`), counted and timed.
    func measure<Result>(_ body: () async throws -> Result) async throws -> Result {
        let started = ContinuousClock.now
        let before = inFlight.wrappingAdd(1, ordering: .relaxed).oldValue
        if let poolSize, before >= poolSize {
            leaseWaits.increment()
        } else {
            inUse.increment()
        }
        defer {
            duration.record(duration: ContinuousClock.now - started)
            // In use = min(in flight, pool size): a query leaving frees a connection only when none was waiting for it.
            let after = inFlight.wrappingSubtract(1, ordering: .relaxed).newValue
            if poolSize.map({ after < $0 }) ?? true { inUse.decrement() }
        }
        return try await body()
    }
}
