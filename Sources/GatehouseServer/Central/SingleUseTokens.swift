import Crypto
import Foundation
import Synchronization

/// Tokens that may be taken once while they are valid (Sign in with Apple identity tokens: a
/// captured or replayed one must not open session after session). Kept as SHA-256 hashes until
/// their expiry, in this process; bounded, refusing rather than forgetting when full.
final class SingleUseTokens: Sendable {
    enum Outcome: Equatable { case first, replay, full }

    private struct State {
        var seen: [Data: Date] = [:]
        var lastPrune = Date.distantPast
    }

    private let state = Mutex(State())
    private let capacity: Int

    init(capacity: Int = 100_000) {
        self.capacity = capacity
    }

    func take(_ token: String, validUntil: Date, now: Date) -> Outcome {
        let key = Data(SHA256.hash(data: Data(token.utf8)))
        return state.withLock { state in
            if let until = state.seen[key], until > now { return .replay }
            if state.seen.count >= capacity {
                if now.timeIntervalSince(state.lastPrune) >= 10 {
                    state.lastPrune = now
                    state.seen = state.seen.filter { $0.value > now }
                }
                if state.seen.count >= capacity { return .full }
            }
            state.seen[key] = validUntil
            return .first
        }
    }
}
