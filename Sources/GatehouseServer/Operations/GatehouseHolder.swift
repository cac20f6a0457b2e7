public import GatehouseCore
import NIOHTTP1
import Synchronization

/// The running `Gatehouse`, which a reload (SIGHUP) replaces: every request reads it once, at
/// its start, and keeps that value to its end, so a reload never changes a request midway.
public final class GatehouseHolder: Sendable {
    private let value: Mutex<Gatehouse>

    public init(_ gatehouse: Gatehouse) {
        value = Mutex(gatehouse)
    }

    public var current: Gatehouse { value.withLock { $0 } }

    func replace(with gatehouse: Gatehouse) {
        value.withLock { $0 = gatehouse }
    }
}

/// The fast path's planner for the configuration in force: replaced with the `Gatehouse` on
/// reload; `nil` (every request to the general path) when no route is configured or while
/// tracing is on.
final class ReloadablePlanner: FastRelayPlanning, Sendable {
    private let planner: Mutex<FastRelayPlanner?>

    init(_ planner: FastRelayPlanner?) {
        self.planner = Mutex(planner)
    }

    func replace(with planner: FastRelayPlanner?) {
        self.planner.withLock { $0 = planner }
    }

    func plan(_ request: HTTPRequestHead, remoteAddress: String?, memo: inout ConnectionMemo) -> FastRelayPlan? {
        planner.withLock { $0 }?.plan(request, remoteAddress: remoteAddress, memo: &memo)
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
