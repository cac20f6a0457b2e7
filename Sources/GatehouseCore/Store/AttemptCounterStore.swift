public import Foundation

/// Counters of failed attempts in a window, shared by every instance on the store: how many
/// wrong passwords one account has had in the last minutes, whichever instance saw them. A
/// counter lives in the single-use table (kind `attempts:<purpose>`), so it needs no table of its
/// own and the expiry sweep removes it.
public protocol AttemptCounterStore: Sendable {
    /// Adds one to the counter of `keyHash` and returns the new count. A counter whose window has
    /// ended starts again at 1 with a window ending at `expiresAt`; a running one keeps its window.
    func countAttempt(purpose: String, keyHash: String, expiresAt: Date, now: Date) async throws -> Int
    /// The count of the running window (0 when none).
    func attemptCount(purpose: String, keyHash: String, now: Date) async throws -> Int
    /// Takes one back (an attempt counted before it was made, that the upstream never judged); never below 0.
    func discountAttempt(purpose: String, keyHash: String, now: Date) async throws
    /// Forgets the counter (after a success).
    func resetAttempts(purpose: String, keyHash: String) async throws
}

/// How the stores keep a counter in the single-use table.
public enum AttemptCounter {
    /// The single-use kind a counter of `purpose` is kept under.
    public static func kind(_ purpose: String) -> String { "attempts:" + purpose }

    /// A stored count (its decimal digits), 0 when unreadable.
    public static func count(decoding value: Data?) -> Int {
        value.flatMap { Int(String(decoding: $0, as: UTF8.self)) } ?? 0
    }
}
