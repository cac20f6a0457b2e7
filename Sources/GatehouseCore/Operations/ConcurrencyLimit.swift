import Synchronization

/// At most `limit` calls at once, and at most `limit` more waiting their turn; beyond that a
/// call fails at once with `ConcurrencyLimit.Full` (the caller answers 503 rather than queue
/// without bound). Waiters are served in order; a cancelled waiter leaves the queue.
public final class ConcurrencyLimit: Sendable {
    public struct Full: Error, Sendable {}

    public let limit: Int
    private let maximumWaiting: Int
    private let state: Mutex<State>

    struct State {
        var running = 0
        /// Callers that decided to wait and are about to join `waiting` (they count against the cap).
        var reserved = 0
        var nextID = 0
        var waiting: [(id: Int, continuation: CheckedContinuation<Void, any Error>)] = []
    }

    public init(limit: Int, maximumWaiting: Int? = nil) {
        self.limit = limit
        self.maximumWaiting = maximumWaiting ?? limit
        self.state = Mutex(State())
    }

    /// Calls running now (for tests and the metrics).
    public var running: Int { state.withLock { $0.running } }
    /// Calls waiting for a permit.
    public var waiting: Int { state.withLock { $0.waiting.count + $0.reserved } }

    public func withPermit<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async throws {
        enum Entry { case granted, full, wait(Int) }
        let entry: Entry = state.withLock { state in
            if state.running < limit {
                state.running += 1
                return .granted
            }
            guard state.waiting.count + state.reserved < maximumWaiting else { return .full }
            state.reserved += 1
            state.nextID += 1
            return .wait(state.nextID)
        }
        switch entry {
        case .granted: return
        case .full: throw Full()
        case .wait(let id):
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    // A permit may have come back since the first look: take it rather than wait for nothing.
                    enum Now { case cancelled, granted, queued }
                    let now: Now = state.withLock { state in
                        state.reserved -= 1
                        if Task.isCancelled { return .cancelled }
                        if state.running < limit {
                            state.running += 1
                            return .granted
                        }
                        state.waiting.append((id, continuation))
                        return .queued
                    }
                    switch now {
                    case .cancelled: continuation.resume(throwing: CancellationError())
                    case .granted: continuation.resume()
                    case .queued: break
                    }
                }
            } onCancel: {
                let cancelled = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                    guard let index = state.waiting.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiting.remove(at: index).continuation
                }
                cancelled?.resume(throwing: CancellationError())
            }
        }
    }

    /// Hands the permit to the first waiter, or gives it back.
    private func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, any Error>? in
            guard !state.waiting.isEmpty else {
                state.running -= 1
                return nil
            }
            return state.waiting.removeFirst().continuation
        }
        next?.resume()
    }
}
