public import Foundation
public import GatehouseCore
import NIOCore
import SQLiteNIO

extension SQLiteAuthorizationStore: SessionStore {
    static let sessionSchema = [
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY NOT NULL,
            client_id TEXT NOT NULL,
            upstream TEXT NOT NULL,
            subject TEXT,
            key_id TEXT NOT NULL,
            sealed_tokens BLOB NOT NULL,
            upstream_expires_at INTEGER,
            version INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            revoked_at INTEGER,
            lease_owner TEXT,
            lease_until INTEGER
        ) WITHOUT ROWID
        """,
        "CREATE INDEX sessions_subject ON sessions (subject)",
        """
        CREATE TABLE access_tokens (
            hash TEXT PRIMARY KEY NOT NULL,
            session_id TEXT NOT NULL,
            expires_at INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        "CREATE INDEX access_tokens_session ON access_tokens (session_id)",
        """
        CREATE TABLE refresh_tokens (
            hash TEXT PRIMARY KEY NOT NULL,
            session_id TEXT NOT NULL,
            expires_at INTEGER NOT NULL,
            replaced_at INTEGER,
            successor_sealed BLOB
        ) WITHOUT ROWID
        """,
        "CREATE INDEX refresh_tokens_session ON refresh_tokens (session_id)",
    ]

    private static let sessionColumns =
        "id, client_id, upstream, subject, key_id, sealed_tokens, upstream_expires_at, version, created_at, expires_at, revoked_at, dpop_jkt"
    /// What a read returns: the written columns and the refresh lease.
    private static let sessionReadColumns = sessionColumns + ", lease_owner, lease_until"

    public func insertSession(_ session: SessionRecord) async throws {
        _ = try await connection.query(
            "INSERT INTO sessions (\(Self.sessionColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [.text(session.id), .text(session.clientID), .text(session.upstream), session.subject.map(SQLiteData.text) ?? .null,
             .text(session.keyID), .blob(ByteBuffer(bytes: session.sealedTokens)), Self.optionalTime(session.upstreamExpiresAt),
             .integer(session.version), .integer(Self.milliseconds(session.createdAt)), .integer(Self.milliseconds(session.expiresAt)),
             Self.optionalTime(session.revokedAt), session.dpopJKT.map(SQLiteData.text) ?? .null])
    }

    public func session(id: String) async throws -> SessionRecord? {
        try await connection.query("SELECT \(Self.sessionReadColumns) FROM sessions WHERE id = ?", [.text(id)]).first.flatMap(Self.session)
    }

    public func session(forAccessTokenHash hash: String, now: Date) async throws -> (session: SessionRecord, accessExpiresAt: Date)? {
        let columns = Self.sessionReadColumns.split(separator: ",").map { "s." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")
        let rows = try await connection.query(
            """
            SELECT \(columns), a.expires_at AS access_expires_at FROM access_tokens a JOIN sessions s ON s.id = a.session_id
            WHERE a.hash = ? AND a.expires_at > ? AND s.revoked_at IS NULL AND s.expires_at > ?
            """,
            [.text(hash), .integer(Self.milliseconds(now)), .integer(Self.milliseconds(now))])
        guard let row = rows.first, let session = Self.session(row), let expires = row.column("access_expires_at")?.integer else { return nil }
        return (session, Self.date(expires))
    }

    public func insertAccessToken(hash: String, sessionID: String, expiresAt: Date) async throws {
        _ = try await connection.query("INSERT INTO access_tokens (hash, session_id, expires_at) VALUES (?, ?, ?)",
                                       [.text(hash), .text(sessionID), .integer(Self.milliseconds(expiresAt))])
    }

    public func insertRefreshToken(hash: String, sessionID: String, expiresAt: Date) async throws {
        _ = try await connection.query("INSERT INTO refresh_tokens (hash, session_id, expires_at) VALUES (?, ?, ?)",
                                       [.text(hash), .text(sessionID), .integer(Self.milliseconds(expiresAt))])
    }

    public func refreshToken(hash: String) async throws -> RefreshTokenRecord? {
        let rows = try await connection.query(
            "SELECT hash, session_id, expires_at, replaced_at, successor_sealed FROM refresh_tokens WHERE hash = ?", [.text(hash)])
        guard let row = rows.first, let hash = row.column("hash")?.string, let session = row.column("session_id")?.string,
              let expires = row.column("expires_at")?.integer else { return nil }
        return RefreshTokenRecord(hash: hash, sessionID: session, expiresAt: Self.date(expires),
                                  replacedAt: row.column("replaced_at")?.integer.map(Self.date),
                                  successorSealed: row.column("successor_sealed")?.blob.map { Data($0.readableBytesView) })
    }

    public func markRefreshTokenReplaced(hash: String, successorSealed: Data, now: Date) async throws -> Bool {
        let rows = try await connection.query(
            """
            UPDATE refresh_tokens SET replaced_at = ?, successor_sealed = ?
            WHERE hash = ? AND replaced_at IS NULL AND expires_at > ? RETURNING 1
            """,
            [.integer(Self.milliseconds(now)), .blob(ByteBuffer(bytes: successorSealed)), .text(hash), .integer(Self.milliseconds(now))])
        return !rows.isEmpty
    }

    public func deleteTokens(accessHash: String, refreshHash: String) async throws {
        _ = try await connection.query("DELETE FROM access_tokens WHERE hash = ?", [.text(accessHash)])
        _ = try await connection.query("DELETE FROM refresh_tokens WHERE hash = ?", [.text(refreshHash)])
    }

    public func revokeSession(id: String, now: Date) async throws {
        _ = try await connection.query("UPDATE sessions SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                                       [.integer(Self.milliseconds(now)), .text(id)])
        _ = try await connection.query("DELETE FROM access_tokens WHERE session_id = ?", [.text(id)])
    }

    public func revokeSession(id: String, ifVersion version: Int, now: Date) async throws -> Bool {
        let rows = try await connection.query(
            "UPDATE sessions SET revoked_at = ? WHERE id = ? AND version = ? AND revoked_at IS NULL RETURNING 1",
            [.integer(Self.milliseconds(now)), .text(id), .integer(version)])
        guard !rows.isEmpty else { return false }
        _ = try await connection.query("DELETE FROM access_tokens WHERE session_id = ?", [.text(id)])
        return true
    }

    public func rewrapSession(id: String, expectedVersion: Int, fromKeyID: String, keyID: String, sealed: Data, now: Date) async throws -> Bool {
        let rows = try await connection.query(
            """
            UPDATE sessions SET key_id = ?, sealed_tokens = ?
            WHERE id = ? AND version = ? AND key_id = ? AND (lease_until IS NULL OR lease_until <= ?) RETURNING 1
            """,
            [.text(keyID), .blob(ByteBuffer(bytes: sealed)), .text(id), .integer(expectedVersion), .text(fromKeyID),
             .integer(Self.milliseconds(now))])
        return !rows.isEmpty
    }

    public func acquireRefreshLease(sessionID: String, owner: String, until: Date, now: Date) async throws -> Bool {
        let rows = try await connection.query(
            """
            UPDATE sessions SET lease_owner = ?, lease_until = ?
            WHERE id = ? AND revoked_at IS NULL AND (lease_until IS NULL OR lease_until <= ? OR lease_owner = ?) RETURNING 1
            """,
            [.text(owner), .integer(Self.milliseconds(until)), .text(sessionID), .integer(Self.milliseconds(now)), .text(owner)])
        return !rows.isEmpty
    }

    public func writeUpstreamTokens(sessionID: String, expectedVersion: Int, keyID: String, sealed: Data,
                                    upstreamExpiresAt: Date?) async throws -> Bool {
        let rows = try await connection.query(
            """
            UPDATE sessions SET key_id = ?, sealed_tokens = ?, upstream_expires_at = ?, version = version + 1,
                lease_owner = NULL, lease_until = NULL
            WHERE id = ? AND version = ? AND revoked_at IS NULL RETURNING 1
            """,
            [.text(keyID), .blob(ByteBuffer(bytes: sealed)), Self.optionalTime(upstreamExpiresAt), .text(sessionID), .integer(expectedVersion)])
        return !rows.isEmpty
    }

    public func releaseRefreshLease(sessionID: String, owner: String) async throws {
        _ = try await connection.query("UPDATE sessions SET lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
                                       [.text(sessionID), .text(owner)])
    }

    public func setSubject(_ subject: String, sessionID: String) async throws {
        _ = try await connection.query("UPDATE sessions SET subject = ? WHERE id = ?", [.text(subject), .text(sessionID)])
    }

    public func sessionsSealed(notUnder activeKeyID: String, limit: Int) async throws -> [SessionRecord] {
        try await connection.query(
            "SELECT \(Self.sessionReadColumns) FROM sessions WHERE key_id <> ? AND revoked_at IS NULL LIMIT ?",
            [.text(activeKeyID), .integer(limit)]).compactMap(Self.session)
    }

    public func sessions(subject: String?) async throws -> [SessionRecord] {
        let rows = if let subject {
            try await connection.query("SELECT \(Self.sessionReadColumns) FROM sessions WHERE subject = ? ORDER BY created_at", [.text(subject)])
        } else {
            try await connection.query("SELECT \(Self.sessionReadColumns) FROM sessions ORDER BY created_at", [])
        }
        return rows.compactMap(Self.session)
    }

    public func sessions(clientID: String) async throws -> [SessionRecord] {
        try await connection.query("SELECT \(Self.sessionReadColumns) FROM sessions WHERE client_id = ? ORDER BY created_at",
                                   [.text(clientID)]).compactMap(Self.session)
    }

    private static func session(_ row: SQLiteRow) -> SessionRecord? {
        guard let id = row.column("id")?.string, let client = row.column("client_id")?.string,
              let upstream = row.column("upstream")?.string, let keyID = row.column("key_id")?.string,
              let sealed = row.column("sealed_tokens")?.blob, let version = row.column("version")?.integer,
              let created = row.column("created_at")?.integer, let expires = row.column("expires_at")?.integer
        else { return nil }
        return SessionRecord(
            id: id, clientID: client, upstream: upstream, subject: row.column("subject")?.string, keyID: keyID,
            sealedTokens: Data(sealed.readableBytesView), upstreamExpiresAt: row.column("upstream_expires_at")?.integer.map(date),
            version: version, createdAt: date(created), expiresAt: date(expires), revokedAt: row.column("revoked_at")?.integer.map(date),
            leaseOwner: row.column("lease_owner")?.string, leaseUntil: row.column("lease_until")?.integer.map(date),
            dpopJKT: row.column("dpop_jkt")?.string)
    }

    static func optionalTime(_ date: Date?) -> SQLiteData {
        date.map { .integer(milliseconds($0)) } ?? .null
    }

    static func date(_ milliseconds: Int) -> Date {
        Date(timeIntervalSince1970: Double(milliseconds) / 1000)
    }
}
