import Foundation
import Synchronization

/// An upstream's request to be left alone: after its token endpoint answers 429 (RFC 6585 §4),
/// Gatehouse sends that endpoint nothing until the time its `Retry-After` names, and answers the
/// app 503 `temporarily_unavailable` with the seconds that remain. One per profile, shared by
/// every request to that upstream; in process (each instance learns on its own).
final class UpstreamBackoff: Sendable {
    /// The wait when the 429 names none, or names it unreadably.
    static let defaultWait: Duration = .seconds(5)
    /// The longest wait honoured: an upstream cannot switch Gatehouse off for long.
    static let maximumWait: Duration = .seconds(300)

    private let until = Mutex<ContinuousClock.Instant?>(nil)
    private let clock: @Sendable () -> ContinuousClock.Instant

    init(now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.clock = now
    }

    /// The whole seconds (rounded up) the upstream still asks Gatehouse to wait, or `nil`.
    func remainingSeconds() -> Int? {
        let now = clock()
        let remaining: Duration? = until.withLock { until in
            guard let end = until else { return nil }
            guard end > now else {
                until = nil
                return nil
            }
            return end - now
        }
        return remaining.map(Self.wholeSeconds)
    }

    /// Starts the wait a 429 asks for (or keeps a longer one under way); returns its whole seconds.
    @discardableResult
    func start(retryAfter: String?, date: Date = Date()) -> Int {
        let wait = Self.wait(retryAfter: retryAfter, now: date)
        let end = clock() + wait
        until.withLock { until in
            if let current = until, current > end { return }
            until = end
        }
        return Self.wholeSeconds(wait)
    }

    /// How long a `Retry-After` (RFC 9110 §10.2.3) asks to wait: delay-seconds, or an HTTP-date
    /// (IMF-fixdate, or the obsolete RFC 850 and asctime forms). Absent or unreadable:
    /// `defaultWait`. Never under one second, never over `maximumWait`.
    static func wait(retryAfter: String?, now: Date) -> Duration {
        guard let text = retryAfter?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return defaultWait }
        let asked: Duration
        if text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            // Too many digits for an Int is still a number: the longest wait.
            asked = Int(text).map { .seconds($0) } ?? maximumWait
        } else if let date = httpDate(text) {
            asked = .milliseconds(Int64((date.timeIntervalSince(now) * 1000).rounded(.up)))
        } else {
            return defaultWait
        }
        return min(max(asked, .seconds(1)), maximumWait)
    }

    /// An HTTP-date in any of the three forms RFC 9110 §5.6.7 requires recipients to read.
    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        // asctime pads the day with a space ("Nov  6"): one space is as good.
        let single = text.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
        for format in ["EEE, dd MMM yyyy HH:mm:ss 'GMT'", "EEEE, dd-MMM-yy HH:mm:ss 'GMT'", "EEE MMM d HH:mm:ss yyyy"] {
            formatter.dateFormat = format
            if let date = formatter.date(from: single) { return date }
        }
        return nil
    }

    /// Seconds rounded up, at least 1: what `Retry-After` tells the app.
    static func wholeSeconds(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.components
        return max(1, Int(seconds) + (attoseconds > 0 ? 1 : 0))
    }
}
