import Foundation
import GatehouseCore
import Logging
import Metrics
import ServiceLifecycle

/// Deletes expired transactions and codes on a fixed interval. Expired rows are already
/// unusable (every consume checks expiry); sweeping only keeps the store small. After each
/// sweep (and at start) it reports how many instance rows the store holds (`gatehouse_instances`).
struct ExpirySweeper: Service {
    let store: any GatehouseStore
    let interval: Duration
    let logger: Logger

    func run() async throws {
        await countInstances()
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: interval)
                await sweepOnce()
            }
        }
    }

    private func sweepOnce() async {
        do {
            let removed = try await store.sweepExpired(now: Date())
            if removed > 0 { logger.debug("swept expired rows", metadata: ["count": .stringConvertible(removed)]) }
        } catch {
            logger.warning("sweeping expired rows failed", metadata: ["error_type": .string(String(describing: type(of: error)))])
        }
        await countInstances()
    }

    private func countInstances() async {
        guard let count = try? await store.instanceCount() else { return }
        Gauge(label: GatehouseMetrics.instancesStored).record(count)
    }
}
