import Dispatch
import Synchronization

/// A gate that work waits at until the test opens it (once; later waiters pass at once).
final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withCheckedContinuation { continuation in
            let passes = state.withLock { state in
                if state.open { return true }
                state.waiting.append(continuation)
                return false
            }
            if passes { continuation.resume() }
        }
    }

    func open() {
        let waiting = state.withLock { state in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}

/// Counts calls, from any task.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)

    var count: Int { value.load(ordering: .relaxed) }

    /// Counts one more and returns the new count (1 for the first).
    func next() -> Int { value.add(1, ordering: .relaxed).newValue }
}

/// Counts arrivals; `reached(_:)` returns once that many have arrived.
final class Arrivals: Sendable {
    private let state = Mutex<(count: Int, waiting: [(Int, CheckedContinuation<Void, Never>)])>((0, []))

    var count: Int { state.withLock { $0.count } }

    func arrive() {
        let ready = state.withLock { state in
            state.count += 1
            let count = state.count
            let ready = state.waiting.filter { $0.0 <= count }.map(\.1)
            state.waiting.removeAll { $0.0 <= count }
            return ready
        }
        for continuation in ready { continuation.resume() }
    }

    func reached(_ target: Int) async {
        await withCheckedContinuation { continuation in
            let passes = state.withLock { state in
                if state.count >= target { return true }
                state.waiting.append((target, continuation))
                return false
            }
            if passes { continuation.resume() }
        }
    }
}

/// One thread that runs every job in the order it was enqueued. Tasks that prefer it
/// (`withTaskExecutorPreference`) never run at the same time, and a task is not interrupted
/// between two awaits: "arrive, then call" is one step no other task on it can come between.
final class SerialTaskExecutor: TaskExecutor {
    private let queue = DispatchQueue(label: "gatehouse.tests.serial")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
