import GatehouseCore
import Synchronization

/// Request ids: a random per-process prefix and a counter, so one costs an atomic increment
/// instead of a round of the system's random generator. Unique per process, unguessable
/// across restarts, and meaningless outside Gatehouse's logs.
final class RequestIDGenerator: Sendable {
    static let shared = RequestIDGenerator()
    private let prefix = String(SecureToken.generate().prefix(10))
    private let counter = Atomic<UInt64>(0)

    func next() -> String {
        let value = counter.wrappingAdd(1, ordering: .relaxed).newValue
        return prefix + "-" + String(value, radix: 36)
    }
}
