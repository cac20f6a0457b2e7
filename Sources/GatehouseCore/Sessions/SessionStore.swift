public import Foundation

/// Durable sealed sessions and Gatehouse's own tokens (stored as SHA-256 only). Compare-and-set
/// operations (`markRefreshTokenReplaced`, `writeUpstreamTokens`, `acquireRefreshLease`) are
/// single atomic statements, so racing requests and instances cannot both win.
public protocol SessionStore: Sendable {
    func insertSession(_ session: SessionRecord) async throws
    func session(id: String) async throws -> SessionRecord?
    /// The live session an access token belongs to and when the token expires; `nil` when the
    /// token is unknown or expired, or its session ended.
    func session(forAccessTokenHash hash: String, now: Date) async throws -> (session: SessionRecord, accessExpiresAt: Date)?
    func insertAccessToken(hash: String, sessionID: String, expiresAt: Date) async throws
    func insertRefreshToken(hash: String, sessionID: String, expiresAt: Date) async throws
    func refreshToken(hash: String) async throws -> RefreshTokenRecord?
    /// Marks a fresh refresh token replaced, storing its sealed successor; `false` when it was not fresh.
    func markRefreshTokenReplaced(hash: String, successorSealed: Data, now: Date) async throws -> Bool
    func deleteTokens(accessHash: String, refreshHash: String) async throws
    /// Ends a session and deletes its access tokens; its refresh tokens stop working.
    func revokeSession(id: String, now: Date) async throws
    /// Ends a session only if it is still at `version` (an upstream's `invalid_grant` for a
    /// refresh token another instance has since replaced must not end the session).
    func revokeSession(id: String, ifVersion version: Int, now: Date) async throws -> Bool
    /// Re-seals a session under another key without bumping its version or touching a lease;
    /// `false` when the session changed, or is being refreshed, meanwhile.
    func rewrapSession(id: String, expectedVersion: Int, fromKeyID: String, keyID: String, sealed: Data, now: Date) async throws -> Bool
    /// Takes the right to refresh the upstream tokens until `until`; `false` when another holds it.
    func acquireRefreshLease(sessionID: String, owner: String, until: Date, now: Date) async throws -> Bool
    /// Writes new upstream tokens if the session is still at `expectedVersion`; `false` otherwise.
    func writeUpstreamTokens(sessionID: String, expectedVersion: Int, keyID: String, sealed: Data,
                             upstreamExpiresAt: Date?) async throws -> Bool
    /// Gives up a refresh lease without writing (the refresh failed).
    func releaseRefreshLease(sessionID: String, owner: String) async throws
    func setSubject(_ subject: String, sessionID: String) async throws
    func sessions(subject: String?) async throws -> [SessionRecord]
    /// Every session of one client id (an app, or a registered instance).
    func sessions(clientID: String) async throws -> [SessionRecord]
    /// Live sessions sealed under another key than `activeKeyID`, for background re-encryption.
    func sessionsSealed(notUnder activeKeyID: String, limit: Int) async throws -> [SessionRecord]
}
