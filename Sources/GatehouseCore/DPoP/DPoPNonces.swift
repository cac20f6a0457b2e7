public import Crypto
public import Foundation
import Synchronization

/// Server nonces for DPoP proofs (RFC 9449 §8), stateless: a nonce is the time step and an
/// HMAC of it under a key every instance derives from the session key ring, so any instance
/// accepts a nonce another gave out. A nonce is good for its step and the next.
public struct DPoPNonces: Sendable {
    private let key: SymmetricKey
    private let step: TimeInterval

    public init(key: SymmetricKey, lifetime: TimeInterval) {
        self.key = key
        self.step = max(1, lifetime)
    }

    /// The nonce to hand out now.
    public func current(now: Date) -> String {
        nonce(step: Int64(now.timeIntervalSince1970 / step))
    }

    public func isValid(_ nonce: String, now: Date) -> Bool {
        let current = Int64(now.timeIntervalSince1970 / step)
        return SecureToken.constantTimeEquals(nonce, self.nonce(step: current))
            || SecureToken.constantTimeEquals(nonce, self.nonce(step: current - 1))
    }

    private func nonce(step: Int64) -> String {
        let bytes = withUnsafeBytes(of: step.bigEndian) { Data($0) }
        let mac = HMAC<SHA256>.authenticationCode(for: bytes, using: key)
        return Base64URL.encode(bytes + Data(mac).prefix(16))
    }
}

/// DPoP proof ids seen lately, in memory, bounded: an entry lasts until its proof could no
/// longer be accepted anyway; when full, the oldest entry goes. An entry that goes before it
/// expired is handed back to be written to the store (`firstUse`'s `spill`), and is still
/// answered from memory until `spilled` says the store has it: every live proof id is always in
/// memory or in the store. The store also answers for the other instances (`SingleUseStore`,
/// kind `dpop_jti`).
public final class DPoPReplayCache: Sendable {
    private struct State {
        var expiries: [String: Date] = [:]
        var order: [String] = []
        var head = 0
        /// Forgotten before their expiry, on their way to the store.
        var spilling: [String: Date] = [:]
        /// Until when an entry forgotten before its expiry could still be replayed.
        var saturatedUntil: Date = .distantPast
    }

    private let maximumEntries: Int
    private let state = Mutex(State())

    public init(maximumEntries: Int) {
        self.maximumEntries = max(1, maximumEntries)
    }

    /// `true` the first time `key` is seen (it is then remembered until `until`), `false` for a
    /// replay. `spill`: live entries forgotten to make room, which the caller writes to the store
    /// and then reports with `spilled`.
    public func firstUse(_ key: String, until: Date, now: Date) -> (fresh: Bool, spill: [(key: String, until: Date)]) {
        state.withLock { state in
            if let expiry = state.expiries[key] ?? state.spilling[key], expiry > now { return (false, []) }
            var spill: [(key: String, until: Date)] = []
            // Forget what expired or overflows, oldest first.
            while state.head < state.order.count {
                let oldest = state.order[state.head]
                let expiry = state.expiries[oldest] ?? .distantPast
                guard state.expiries.count >= maximumEntries || expiry <= now else { break }
                if expiry > now {
                    state.saturatedUntil = max(state.saturatedUntil, expiry)
                    state.spilling[oldest] = expiry
                    spill.append((oldest, expiry))
                }
                state.expiries[oldest] = nil
                state.head += 1
            }
            if state.head > 1024, state.head * 2 > state.order.count {
                state.order.removeFirst(state.head)
                state.head = 0
            }
            if state.expiries.updateValue(until, forKey: key) == nil { state.order.append(key) }
            return (true, spill)
        }
    }

    /// The store has these entries now: memory may forget them.
    public func spilled(_ keys: [String]) {
        state.withLock { state in
            for key in keys { state.spilling[key] = nil }
        }
    }

    public var count: Int { state.withLock { $0.expiries.count } }

    /// Whether an entry was forgotten before it expired (the cache is too small for the load), so
    /// that a proof it held could be replayed now: then the store must be asked too.
    public func isSaturated(now: Date) -> Bool { state.withLock { $0.saturatedUntil > now } }
}
