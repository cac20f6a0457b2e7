public import Foundation
import Synchronization

/// Group commit for one kind of single-use key: keys spent while a write is under way wait for
/// the next one, and that next write carries all of them in one statement
/// (`SingleUseStore.insertEachOnce`). Under load a statement carries as many keys as arrived
/// during the one before, so the store sees a few writes a millisecond however many requests
/// come; alone, a key is written at once. Every caller still learns its own key's answer, and a
/// write that fails fails each of its keys (never accepted unrecorded).
public final class SingleUseGroupCommit: Sendable {
    private typealias Waiter = CheckedContinuation<Result<Bool, any Error>, Never>

    private struct State {
        var queued: [(entry: SingleUseEntry, waiter: Waiter)] = []
        var writing = false
    }

    /// The most keys one statement carries (SQLite's bound parameters are limited).
    public static let maximumBatch = 512

    private let store: any SingleUseStore
    private let kind: String
    private let now: @Sendable () -> Date
    private let state = Mutex(State())

    public init(store: any SingleUseStore, kind: String, now: @escaping @Sendable () -> Date) {
        self.store = store
        self.kind = kind
        self.now = now
    }

    /// `true` when `keyHash` was new and is now written; `false` for a replay.
    public func insertOnce(keyHash: String, expiresAt: Date) async throws -> Bool {
        let result = await withCheckedContinuation { (waiter: Waiter) in
            let startsWriting = state.withLock { state in
                state.queued.append((SingleUseEntry(keyHash: keyHash, expiresAt: expiresAt), waiter))
                guard !state.writing else { return false }
                state.writing = true
                return true
            }
            if startsWriting { Task { await self.writeWhileQueued() } }
        }
        return try result.get()
    }

    /// Writes what is queued, batch after batch, until nothing is.
    private func writeWhileQueued() async {
        while true {
            let batch = state.withLock { state -> [(entry: SingleUseEntry, waiter: Waiter)] in
                let batch = Array(state.queued.prefix(Self.maximumBatch))
                state.queued.removeFirst(batch.count)
                if batch.isEmpty { state.writing = false }
                return batch
            }
            guard !batch.isEmpty else { return }
            let entries = batch.map(\.entry)
            do {
                let inserted: Set<String>
                do {
                    inserted = try await store.insertEachOnce(kind: kind, entries: entries, now: now())
                } catch {
                    // Once more (a deadlock with the expiry sweep, a dropped connection): a failed
                    // statement wrote nothing, and a whole batch answering 503 is worth one retry.
                    inserted = try await store.insertEachOnce(kind: kind, entries: entries, now: now())
                }
                // A key twice in one batch (this instance forgot it in between) is a replay the second time.
                var answered: Set<String> = []
                for item in batch {
                    let fresh = inserted.contains(item.entry.keyHash) && answered.insert(item.entry.keyHash).inserted
                    item.waiter.resume(returning: .success(fresh))
                }
            } catch {
                for item in batch { item.waiter.resume(returning: .failure(error)) }
            }
        }
    }
}
