import Crypto
import Foundation
import Synchronization

/// At most `limit` magic links per address per hour (seed 002 §2: the central provider's own
/// rule, enforced here too so a flood stops before it costs an S2S call). A sliding window per
/// address, keyed by the SHA-256 of the lowercased address; in this process only.
final class MagicLinkLimiter: Sendable {
    private let limit: Int
    private let window: TimeInterval = 3600
    private struct State {
        var sends: [Data: [Date]] = [:]
        var lastPrune = Date.distantPast
    }

    private let state = Mutex(State())
    /// Addresses remembered at most. When full, windows that have run out are dropped (at most
    /// once a minute); when none has, new addresses are refused until one does, so a flood of
    /// distinct addresses can neither grow memory nor slip past the limit.
    private let capacity: Int

    init(limit: Int, capacity: Int = 100_000) {
        self.limit = limit
        self.capacity = capacity
    }

    /// Records a send for `email` and returns `nil`, or refuses it: the seconds until one is allowed.
    func admit(_ email: String, now: Date) -> Int? {
        let key = Data(SHA256.hash(data: Data(email.trimmingCharacters(in: .whitespaces).lowercased().utf8)))
        return state.withLock { state in
            var recent = (state.sends[key] ?? []).filter { now.timeIntervalSince($0) < window }
            if recent.count >= limit, let oldest = recent.first {
                state.sends[key] = recent
                return max(1, Int((oldest.addingTimeInterval(window).timeIntervalSince(now)).rounded(.up)))
            }
            if recent.isEmpty, state.sends[key] == nil, state.sends.count >= capacity {
                if now.timeIntervalSince(state.lastPrune) >= 60 {
                    state.lastPrune = now
                    state.sends = state.sends.filter { $0.value.last.map { now.timeIntervalSince($0) < window } ?? false }
                }
                if state.sends.count >= capacity { return 60 }
            }
            recent.append(now)
            state.sends[key] = recent
            return nil
        }
    }
}
