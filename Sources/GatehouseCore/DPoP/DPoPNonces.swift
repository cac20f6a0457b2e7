public import Crypto
public import Foundation
import Synchronization

/// Server nonces for DPoP proofs (RFC 9449 §8): a nonce is an epoch (a time step) and an HMAC of
/// it. A nonce is good in its epoch and the next.
///
/// - `init(key:lifetime:)`: the key is derived from the session key ring, so every instance
///   accepts a nonce another gave out (`dpop.nonce: true` with the `store` replay protection).
/// - `instanceBound(epoch:)`: the key is made at random when the process starts and never leaves
///   it, so only this process, in this life, accepts its nonces: a proof carrying one can only
///   have been used here, since this start (`dpop.replay_protection: instance_nonce`).
public struct DPoPNonces: Sendable {
    private let key: SymmetricKey
    private let step: TimeInterval
    /// The nonces of the last epochs asked about, so that a request costs no HMAC.
    private let made = NonceMemo()

    public init(key: SymmetricKey, lifetime: TimeInterval) {
        self.key = key
        self.step = max(1, lifetime)
    }

    /// Nonces only this process accepts, under a key made now, epochs of `epoch` seconds.
    public static func instanceBound(epoch: TimeInterval) -> DPoPNonces {
        DPoPNonces(key: SymmetricKey(size: .bits256), lifetime: epoch)
    }

    /// The epoch `now` is in.
    public func epoch(at now: Date) -> Int64 {
        Int64((now.timeIntervalSince1970 / step).rounded(.down))
    }

    /// When an epoch ends.
    public func end(of epoch: Int64) -> Date {
        Date(timeIntervalSince1970: Double(epoch + 1) * step)
    }

    /// The nonce to hand out now.
    public func current(now: Date) -> String {
        nonce(step: epoch(at: now))
    }

    public func isValid(_ nonce: String, now: Date) -> Bool {
        epoch(of: nonce, now: now) != nil
    }

    /// The epoch a nonce names when it is one of these nonces and still good (its epoch is the
    /// current one or the one before); `nil` for anything else, forged, expired or another key's.
    public func epoch(of nonce: String, now: Date) -> Int64? {
        guard nonce.utf8.count == 32, let bytes = Base64URL.decode(nonce), bytes.count == 24 else { return nil }
        let named = bytes.prefix(8).reduce(Int64(0)) { $0 << 8 | Int64($1) }
        let current = epoch(at: now)
        guard named == current || named == current - 1 else { return nil }
        return SecureToken.constantTimeEquals(nonce, self.nonce(step: named)) ? named : nil
    }

    private func nonce(step: Int64) -> String {
        if let known = made.nonce(of: step) { return known }
        let nonce = computed(step: step)
        made.remember(nonce, of: step)
        return nonce
    }

    private func computed(step: Int64) -> String {
        let bytes = withUnsafeBytes(of: step.bigEndian) { Data($0) }
        let mac = HMAC<SHA256>.authenticationCode(for: bytes, using: key)
        return Base64URL.encode(bytes + Data(mac).prefix(16))
    }
}

/// The nonces of the last few epochs a `DPoPNonces` computed (each is the same for the whole epoch).
private final class NonceMemo: Sendable {
    private let entries = Mutex<[(step: Int64, nonce: String)]>([])

    func nonce(of step: Int64) -> String? {
        entries.withLock { entries in entries.first { $0.step == step }?.nonce }
    }

    func remember(_ nonce: String, of step: Int64) {
        entries.withLock { entries in
            entries.removeAll { $0.step == step }
            entries.append((step, nonce))
            if entries.count > 4 { entries.removeFirst(entries.count - 4) }
        }
    }
}

/// The proof ids accepted under instance-bound nonces (`DPoPNonces.instanceBound`), one set per
/// live epoch. A proof is only accepted with a nonce of the current epoch or the one before, and
/// only this process gave those out, so while an epoch's set holds every proof id accepted under
/// it, the set alone answers whether a proof is new: no store is asked. When the epoch before
/// the previous one begins, its set goes whole.
///
/// Bounded: past `maximumEntries` live ids, a new proof is not remembered and the epoch is marked
/// incomplete; from then on every proof of that epoch the set does not hold is `unknown`, and the
/// caller asks the store (which answers for what memory does not hold). The guarantee never
/// rests on an entry memory dropped.
public final class EpochReplaySet: Sendable {
    public enum Use: Equatable, Sendable {
        /// Never seen under this epoch; now remembered. Memory is complete for the epoch.
        case fresh
        /// Seen before.
        case replayed
        /// Memory cannot say (the epoch's set overflowed): ask the store.
        case unknown
        /// The epoch's set is gone (the epoch before the previous one began, by the latest
        /// clock this set has seen): memory can no longer say, and the store never held what
        /// memory alone accepted under it, so the proof is refused.
        case expired
    }

    /// 128 bits of SHA-256 of the proof's key and `jti`: 16 bytes an entry, whatever their length.
    private struct Key: Hashable {
        let high: UInt64
        let low: UInt64

        init(_ text: String) {
            let digest = SHA256.hash(data: Data(text.utf8))
            var high: UInt64 = 0, low: UInt64 = 0
            for (index, byte) in digest.prefix(16).enumerated() {
                if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
            }
            self.high = high
            self.low = low
        }
    }

    private struct Epoch {
        var ids: Set<Key> = []
        /// A proof of this epoch was accepted without being remembered (the set was full).
        var incomplete = false
    }

    private struct State {
        var epochs: [Int64: Epoch] = [:]
        var count = 0
        /// The latest current epoch seen: a clock that steps back never revives a dropped epoch.
        var horizon = Int64.min
    }

    private let maximumEntries: Int
    private let state = Mutex(State())

    public init(maximumEntries: Int) {
        self.maximumEntries = max(1, maximumEntries)
    }

    /// Spends `key` under the nonce epoch `epoch`, while `current` is the epoch now: epochs
    /// before `current - 1` are forgotten first (their nonces are no longer accepted). A proof
    /// whose nonce was checked just before an epoch ended may arrive here after its set went:
    /// `expired`, never `fresh` and never the store's to answer.
    public func firstUse(_ key: String, epoch: Int64, current: Int64) -> Use {
        let key = Key(key)
        return state.withLock { state in
            state.horizon = max(state.horizon, current)
            let oldest = state.horizon - 1
            if state.epochs.keys.contains(where: { $0 < oldest }) {
                for old in Array(state.epochs.keys) where old < oldest {
                    state.count -= state.epochs.removeValue(forKey: old)?.ids.count ?? 0
                }
            }
            guard epoch >= oldest else { return .expired }
            // Changed in place (`default:`): a copy of the set out of the dictionary would copy it whole.
            if state.epochs[epoch]?.ids.contains(key) == true { return .replayed }
            guard state.count < maximumEntries else {
                state.epochs[epoch, default: Epoch()].incomplete = true
                return .unknown
            }
            state.epochs[epoch, default: Epoch()].ids.insert(key)
            state.count += 1
            return state.epochs[epoch]?.incomplete == true ? .unknown : .fresh
        }
    }

    /// Whether `key` was spent under `epoch`, or the epoch's set is gone (nothing is changed).
    public func isRemembered(_ key: String, epoch: Int64) -> Bool {
        let key = Key(key)
        return state.withLock { state in
            epoch < state.horizon - 1 || (state.epochs[epoch]?.ids.contains(key) ?? false)
        }
    }

    public var count: Int { state.withLock { $0.count } }
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
