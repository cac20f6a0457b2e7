import Synchronization

/// One piece of work per key at a time in this process: whoever asks while it runs waits for the
/// same result instead of starting it again (a refresh of one session, or of one refresh token).
final class Coalescer<Value: Sendable>: Sendable {
    private let running = Mutex<[String: Task<Value, Never>]>([:])

    /// The work's result, and whether this caller joined work another caller had started
    /// (`joined`: it got someone else's result, counted as a coalesced refresh).
    func run(_ key: String, _ work: @escaping @Sendable () async -> Value) async -> (value: Value, joined: Bool) {
        let (task, joined): (Task<Value, Never>, Bool) = running.withLock { tasks in
            if let task = tasks[key] { return (task, true) }
            let task = Task<Value, Never> {
                let value = await work()
                _ = self.running.withLock { $0.removeValue(forKey: key) }
                return value
            }
            tasks[key] = task
            return (task, false)
        }
        return (await task.value, joined)
    }
}
