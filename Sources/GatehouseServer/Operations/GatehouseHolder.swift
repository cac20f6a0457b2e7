public import GatehouseCore
import NIOHTTP1
import Synchronization

/// The running `Gatehouse` and the fast path's planner made from it, which a reload (SIGHUP)
/// replaces together, in one step: from the request after the swap on, both paths serve the new
/// configuration. Every request reads them once, at its start, and keeps them to its end, so a
/// reload never changes a request midway.
public final class GatehouseHolder: Sendable {
    private let value: Mutex<InForce>

    /// A `Gatehouse` and its planner: `nil` (every request to the general path) when no route is
    /// configured or while tracing is on. A class, so that a reader holds the lock only to take
    /// one reference, never while copying a `Gatehouse`.
    private final class InForce: Sendable {
        let gatehouse: Gatehouse
        let planner: FastRelayPlanner?

        init(_ gatehouse: Gatehouse) {
            self.gatehouse = gatehouse
            planner = GatehouseApplication.fastRelayPlanner(for: gatehouse)
        }
    }

    public init(_ gatehouse: Gatehouse) {
        value = Mutex(InForce(gatehouse))
    }

    public var current: Gatehouse { value.withLock { $0 }.gatehouse }

    /// Puts `gatehouse` and its planner in force together.
    func replace(with gatehouse: Gatehouse) {
        let inForce = InForce(gatehouse)
        value.withLock { $0 = inForce }
    }
}

/// The fast path asks the holder's planner, the one in force with the holder's `Gatehouse`.
extension GatehouseHolder: FastRelayPlanning {
    func plan(_ request: HTTPRequestHead, remoteAddress: String?, memo: inout ConnectionMemo) -> FastRelayPlan? {
        value.withLock { $0 }.planner?.plan(request, remoteAddress: remoteAddress, memo: &memo)
    }
}

/// Whether this instance takes new work: false from SIGTERM on (`/readyz` answers 503).
public final class Readiness: Sendable {
    private let draining = Atomic<Bool>(false)

    public init() {}

    public var isDraining: Bool { draining.load(ordering: .relaxed) }

    func startDraining() {
        draining.store(true, ordering: .relaxed)
    }
}
