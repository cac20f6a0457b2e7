public import Foundation

/// The refresh-token family as a state machine (RFC 9700 §4.14.2): every use rotates; a
/// retry within the grace window gets the same new pair; a replaced token presented after
/// the window revokes the whole family.
public enum RefreshRotation {
    public enum Decision: Equatable, Sendable {
        /// Fresh token: rotate it (the caller makes the compare-and-set in the store).
        case rotate
        /// Just replaced, within the grace window: answer the pair that replaced it.
        case replay
        /// Replaced before the window: reuse of a stolen or leaked token. Revoke the family.
        case revokeFamily
        /// Unknown, expired, or its session ended.
        case refuse
    }

    public static func decide(_ token: RefreshTokenRecord?, session: SessionRecord?, now: Date, grace: Duration) -> Decision {
        guard let token, let session, session.isLive(at: now), token.expiresAt > now else { return .refuse }
        guard let replacedAt = token.replacedAt else { return .rotate }
        let (seconds, attoseconds) = grace.components
        let window = Double(seconds) + Double(attoseconds) / 1e18
        return now.timeIntervalSince(replacedAt) <= window && token.successorSealed != nil ? .replay : .revokeFamily
    }
}
