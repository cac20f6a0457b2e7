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
/// longer be accepted anyway; when full, the oldest entry goes. It only spares the store the
/// replays it remembers: every proof id is also written to the store at its first use
/// (`SingleUseStore`, kind `dpop_jti`), which answers for what memory forgot, after a restart and
/// on every other instance.
public final class DPoPReplayCache: Sendable {
    private struct State {
        var expiries: [String: Date] = [:]
        var order: [String] = []
        var head = 0
    }

    private let maximumEntries: Int
    private let state = Mutex(State())

    public init(maximumEntries: Int) {
        self.maximumEntries = max(1, maximumEntries)
    }

    /// `true` the first time `key` is seen (it is then remembered until `until`, or until it is
    /// the oldest entry of a full cache), `false` for a replay.
    public func firstUse(_ key: String, until: Date, now: Date) -> Bool {
        state.withLock { state in
            if let expiry = state.expiries[key], expiry > now { return false }
            // Forget what expired or overflows, oldest first.
            while state.head < state.order.count {
                let oldest = state.order[state.head]
                let expiry = state.expiries[oldest] ?? .distantPast
                guard state.expiries.count >= maximumEntries || expiry <= now else { break }
                state.expiries[oldest] = nil
                state.head += 1
            }
            if state.head > 1024, state.head * 2 > state.order.count {
                state.order.removeFirst(state.head)
                state.head = 0
            }
            if state.expiries.updateValue(until, forKey: key) == nil { state.order.append(key) }
            return true
        }
    }

    /// Whether `key` is remembered and live (nothing is changed).
    public func isRemembered(_ key: String, now: Date) -> Bool {
        state.withLock { state in state.expiries[key].map { $0 > now } ?? false }
    }

    public var count: Int { state.withLock { $0.expiries.count } }
}
