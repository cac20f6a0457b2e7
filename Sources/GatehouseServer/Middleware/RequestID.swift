import GatehouseCore
import Synchronization

/// Request ids: a random per-process prefix and a counter, so one costs an atomic increment
/// instead of a round of the system's random generator. Unique per process, unguessable
/// across restarts, and meaningless outside Gatehouse's logs.
///
/// 7 random characters (42 bits), `-` and the counter in base 36: for the first 78 billion
/// requests (36⁷) the id stays within 15 bytes, which Swift keeps inside the `String` itself
/// (no allocation per request; the relay adds the id to the backend's request and to the app's answer).
final class RequestIDGenerator: Sendable {
    static let shared = RequestIDGenerator()
    private let prefix = String(SecureToken.generate().prefix(7)) + "-"
    private let counter = Atomic<UInt64>(0)

    func next() -> String {
        let value = counter.wrappingAdd(1, ordering: .relaxed).newValue
        return prefix + String(value, radix: 36)
    }
}
