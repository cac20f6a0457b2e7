import Crypto
import GatehouseCore
import Foundation
import Synchronization

/// The limits on magic links, each a sliding hour, in this process only:
///
/// - per mailbox: at most `mailboxLimit` (seed 002 §2: the central provider's own rule, enforced
///   here too so a flood stops before it costs an S2S call), counted by the mailbox an address
///   reaches (`mailbox(of:)`), so `Victim+1@`, `vic.tim@gmail.com` and `victim@googlemail.com`
///   are one mailbox, not three;
/// - per client address (as `rate_limits` resolves it: the peer, or what a trusted proxy says;
///   an IPv6 address by its /64): at most `addressLimit`, whatever mailboxes they go to.
///
/// The address is counted first: a send it refuses charges no mailbox, so nobody can spend
/// another person's mailbox allowance with requests Gatehouse refuses anyway.
final class MagicLinkLimiter: Sendable {
    /// Which limit refused a send, and the seconds until one is allowed.
    struct Refusal: Equatable {
        enum Limit: String { case mailbox, address }
        let limit: Limit
        let retryAfter: Int
    }

    private let mailboxes: SlidingHour
    private let addresses: SlidingHour

    init(mailboxLimit: Int, addressLimit: Int, capacity: Int = 100_000) {
        mailboxes = SlidingHour(limit: mailboxLimit, capacity: capacity)
        addresses = SlidingHour(limit: addressLimit, capacity: capacity)
    }

    /// Records a send to `email` from `clientAddress` and returns `nil`, or refuses it.
    func admit(_ email: String, clientAddress: String?, now: Date) -> Refusal? {
        if let clientAddress, let wait = addresses.admit("address:" + clientAddress, now: now) {
            return Refusal(limit: .address, retryAfter: wait)
        }
        if let wait = mailboxes.admit("mailbox:" + Self.mailbox(of: email), now: now) {
            return Refusal(limit: .mailbox, retryAfter: wait)
        }
        return nil
    }

    /// The mailbox an address reaches, as the limit counts it: folded as every account counter is
    /// (`AccountSpelling`: case, accents, invisible characters); the local part without a `+tag`
    /// (sub-addressing, RFC 5233); for Gmail, dots in the local part dropped and `googlemail.com`
    /// taken as `gmail.com`.
    static func mailbox(of email: String) -> String {
        let address = AccountSpelling.folded(email.trimmingCharacters(in: .whitespaces))
        guard let at = address.lastIndex(of: "@") else { return address }
        var local = String(address[..<at])
        var domain = String(address[address.index(after: at)...])
        if let plus = local.firstIndex(of: "+") { local = String(local[..<plus]) }
        if domain == "googlemail.com" { domain = "gmail.com" }
        if domain == "gmail.com" { local.removeAll { $0 == "." } }
        return local + "@" + domain
    }
}

/// At most `limit` events per key in any hour. Keys are kept as SHA-256 hashes. When `capacity`
/// keys are remembered, windows that have run out are dropped (at most once a minute); when none
/// has, new keys are refused until one does, so a flood of distinct keys can neither grow memory
/// nor slip past the limit.
private final class SlidingHour: Sendable {
    private let limit: Int
    private let capacity: Int
    private let window: TimeInterval = 3600
    private struct State {
        var events: [Data: [Date]] = [:]
        var lastPrune = Date.distantPast
    }

    private let state = Mutex(State())

    init(limit: Int, capacity: Int) {
        self.limit = limit
        self.capacity = capacity
    }

    /// Records an event for `key` and returns `nil`, or refuses it: the seconds until one is allowed.
    func admit(_ key: String, now: Date) -> Int? {
        let hash = Data(SHA256.hash(data: Data(key.utf8)))
        return state.withLock { state in
            var recent = (state.events[hash] ?? []).filter { now.timeIntervalSince($0) < window }
            if recent.count >= limit, let oldest = recent.first {
                state.events[hash] = recent
                return max(1, Int((oldest.addingTimeInterval(window).timeIntervalSince(now)).rounded(.up)))
            }
            if recent.isEmpty, state.events[hash] == nil, state.events.count >= capacity {
                if now.timeIntervalSince(state.lastPrune) >= 60 {
                    state.lastPrune = now
                    state.events = state.events.filter { $0.value.last.map { now.timeIntervalSince($0) < window } ?? false }
                }
                if state.events.count >= capacity { return 60 }
            }
            recent.append(now)
            state.events[hash] = recent
            return nil
        }
    }
}
