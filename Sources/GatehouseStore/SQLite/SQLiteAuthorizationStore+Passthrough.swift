public import Foundation
public import GatehouseCore
import NIOCore
import SQLiteNIO

extension SQLiteAuthorizationStore: PassthroughTokenStore {
    static let passthroughSchema = [
        """
        CREATE TABLE passthrough_tokens (
            hash TEXT PRIMARY KEY NOT NULL,
            client_id TEXT NOT NULL,
            upstream TEXT NOT NULL,
            expires_at INTEGER NOT NULL,
            lease_owner TEXT,
            lease_until INTEGER,
            answered_at INTEGER,
            answer_sealed BLOB,
            rotated INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID
        """,
        "CREATE INDEX passthrough_tokens_expiry ON passthrough_tokens (expires_at)",
    ]

    public func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws {
        guard !tokens.isEmpty else { return }
        // One statement for the pair: one trip to the store's thread on a refresh's critical path.
        var binds: [SQLiteData] = []
        for token in tokens {
            binds += [.text(token.hash), .text(clientID), .text(upstream), .integer(Self.milliseconds(token.expiresAt))]
        }
        _ = try await connection.query(
            "INSERT INTO passthrough_tokens (hash, client_id, upstream, expires_at) VALUES "
                + Array(repeating: "(?, ?, ?, ?)", count: tokens.count).joined(separator: ", ") + " ON CONFLICT (hash) DO NOTHING",
            binds)
    }

    public func passthroughToken(hash: String) async throws -> PassthroughTokenRecord? {
        let rows = try await connection.query(
            """
            SELECT hash, client_id, upstream, expires_at, lease_owner, lease_until, answered_at, answer_sealed, rotated
            FROM passthrough_tokens WHERE hash = ?
            """, [.text(hash)])
        return rows.first.flatMap(Self.passthroughRecord)
    }

    /// One statement: every assignment is computed from the row as it was (`may`, the lease's
    /// condition of `acquirePassthroughRefresh`), so the row is changed only when the lease is
    /// taken, and returned either way (RETURNING gives the values the statement left). The owner
    /// is new to each attempt: the lease is this statement's when the row names it.
    public func readPassthroughRefresh(hash: String, clientID: String, owner: String, until: Date, now: Date,
                                       answeredBefore: Date) async throws -> PassthroughLeaseAttempt {
        let may = """
            (client_id = ?2 AND (lease_until IS NULL OR lease_until <= ?5 OR lease_owner = ?3)
             AND (answered_at IS NULL OR (rotated = 0 AND answer_sealed IS NOT NULL AND answered_at < ?6)))
            """
        let rows = try await connection.query(
            """
            UPDATE passthrough_tokens SET lease_owner = IIF(\(may), ?3, lease_owner), lease_until = IIF(\(may), ?4, lease_until),
                answered_at = IIF(\(may), NULL, answered_at), answer_sealed = IIF(\(may), NULL, answer_sealed),
                rotated = IIF(\(may), 0, rotated)
            WHERE hash = ?1
            RETURNING hash, client_id, upstream, expires_at, lease_owner, lease_until, answered_at, answer_sealed, rotated,
                lease_owner IS ?3 AS leased
            """,
            [.text(hash), .text(clientID), .text(owner), .integer(Self.milliseconds(until)), .integer(Self.milliseconds(now)),
             .integer(Self.milliseconds(answeredBefore))])
        guard let row = rows.first else { return PassthroughLeaseAttempt(record: nil, leased: false) }
        return PassthroughLeaseAttempt(record: Self.passthroughRecord(row), leased: row.column("leased")?.integer == 1)
    }

    private static func passthroughRecord(_ row: SQLiteRow) -> PassthroughTokenRecord? {
        guard let hash = row.column("hash")?.string, let client = row.column("client_id")?.string,
              let upstream = row.column("upstream")?.string, let expires = row.column("expires_at")?.integer else { return nil }
        return PassthroughTokenRecord(
            hash: hash, clientID: client, upstream: upstream, expiresAt: Self.date(expires), leaseOwner: row.column("lease_owner")?.string,
            leaseUntil: row.column("lease_until")?.integer.map(Self.date), answeredAt: row.column("answered_at")?.integer.map(Self.date),
            answerSealed: row.column("answer_sealed")?.blob.map { Data($0.readableBytesView) }, rotated: row.column("rotated")?.integer == 1)
    }

    public func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                          answeredBefore: Date, expiresAt: Date) async throws -> Bool {
        let rows = try await connection.query(
            """
            INSERT INTO passthrough_tokens (hash, client_id, upstream, expires_at, lease_owner, lease_until) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT (hash) DO UPDATE SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until,
                answered_at = NULL, answer_sealed = NULL, rotated = 0
            WHERE passthrough_tokens.client_id = excluded.client_id
              AND (passthrough_tokens.lease_until IS NULL OR passthrough_tokens.lease_until <= ?
                   OR passthrough_tokens.lease_owner = excluded.lease_owner)
              AND (passthrough_tokens.answered_at IS NULL
                   OR (passthrough_tokens.rotated = 0 AND passthrough_tokens.answer_sealed IS NOT NULL AND passthrough_tokens.answered_at < ?))
            RETURNING 1
            """,
            [.text(hash), .text(clientID), .text(upstream), .integer(Self.milliseconds(expiresAt)), .text(owner),
             .integer(Self.milliseconds(until)), .integer(Self.milliseconds(now)), .integer(Self.milliseconds(answeredBefore))])
        return !rows.isEmpty
    }

    public func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool {
        let rows = try await connection.query(
            """
            UPDATE passthrough_tokens SET answered_at = ?, answer_sealed = ?, rotated = ?, lease_owner = NULL, lease_until = NULL,
                expires_at = ?
            WHERE hash = ? AND (answered_at IS NULL OR (answer_sealed IS NULL AND ? IS NOT NULL)) RETURNING 1
            """,
            [.integer(Self.milliseconds(now)), sealed.map { .blob(ByteBuffer(bytes: $0)) } ?? .null, .integer(rotated ? 1 : 0),
             .integer(Self.milliseconds(keepUntil)), .text(hash), sealed.map { .blob(ByteBuffer(bytes: $0)) } ?? .null])
        return !rows.isEmpty
    }

    public func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws {
        _ = try await connection.query(
            forget ? "DELETE FROM passthrough_tokens WHERE hash = ? AND lease_owner = ? AND answered_at IS NULL"
                : "UPDATE passthrough_tokens SET lease_owner = NULL, lease_until = NULL WHERE hash = ? AND lease_owner = ?",
            [.text(hash), .text(owner)])
    }
}

extension SQLiteAuthorizationStore: RevocationAnnouncer {
    /// One instance per SQLite file: it has already dropped what it cached.
    public func announceRevocation(_ message: String) async throws {}
}
