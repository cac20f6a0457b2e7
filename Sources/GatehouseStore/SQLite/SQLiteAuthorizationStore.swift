public import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import SQLiteNIO

/// The embedded store: one SQLite file, for a single Gatehouse instance.
///
/// Single use rests on `DELETE … RETURNING`: SQLite applies the whole delete during the
/// statement's first step, so of two racing consumers exactly one receives the row.
public final class SQLiteAuthorizationStore: AuthorizationStore {
    /// Every query of the store goes through it (and is measured there).
    let connection: MeasuredSQLiteConnection

    private init(connection: SQLiteConnection) {
        self.connection = MeasuredSQLiteConnection(connection: connection, telemetry: StoreTelemetry(store: "sqlite", poolSize: 1))
    }

    /// Opens (creating when missing) the database file and applies the schema.
    public static func open(path: String, logger: Logger) async throws -> SQLiteAuthorizationStore {
        let storage: SQLiteConnection.Storage = path == ":memory:" ? .memory : .file(path: path)
        let connection = try await SQLiteConnection.open(storage: storage, logger: logger)
        let store = SQLiteAuthorizationStore(connection: connection)
        try await store.migrate()
        return store
    }

    /// Closes the database; the store must not be used afterwards.
    public func close() async throws {
        try await connection.close()
    }

    /// Applies the migrations the file has not seen yet (`PRAGMA user_version` counts them).
    private func migrate() async throws {
        _ = try await connection.query("PRAGMA journal_mode = WAL", [])
        _ = try await connection.query("PRAGMA synchronous = NORMAL", [])
        let version = try await connection.query("PRAGMA user_version", []).first?.column("user_version")?.integer ?? 0
        for (index, migration) in Self.migrations.enumerated() where index >= version {
            for statement in migration { _ = try await connection.query(statement, []) }
            _ = try await connection.query("PRAGMA user_version = \(index + 1)", [])
        }
    }

    /// Versioned schema changes, applied in order at start. Append; never edit a released one.
    static let migrations: [[String]] = [authorizationSchema, sessionSchema, passthroughSchema, instanceSchema, instanceLimitsSchema]

    static let authorizationSchema = [
        """
        CREATE TABLE IF NOT EXISTS authorization_transactions (
            state_hash TEXT PRIMARY KEY NOT NULL,
            payload BLOB NOT NULL,
            expires_at INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS authorization_transactions_expiry ON authorization_transactions (expires_at)",
        """
        CREATE TABLE IF NOT EXISTS issued_codes (
            code_hash TEXT PRIMARY KEY NOT NULL,
            sealed BLOB NOT NULL,
            expires_at INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS issued_codes_expiry ON issued_codes (expires_at)",
    ]

    public func insertTransaction(sealed: Data, stateHash: String, expiresAt: Date) async throws {
        _ = try await connection.query(
            "INSERT INTO authorization_transactions (state_hash, payload, expires_at) VALUES (?, ?, ?)",
            [.text(stateHash), .blob(ByteBuffer(bytes: sealed)), .integer(Self.milliseconds(expiresAt))])
    }

    public func consumeTransaction(stateHash: String, now: Date) async throws -> Data? {
        let rows = try await connection.query(
            "DELETE FROM authorization_transactions WHERE state_hash = ? AND expires_at > ? RETURNING payload",
            [.text(stateHash), .integer(Self.milliseconds(now))])
        return rows.first?.column("payload")?.blob.map { Data($0.readableBytesView) }
    }

    public func insertCode(sealed: Data, codeHash: String, expiresAt: Date) async throws {
        _ = try await connection.query(
            "INSERT INTO issued_codes (code_hash, sealed, expires_at) VALUES (?, ?, ?)",
            [.text(codeHash), .blob(ByteBuffer(bytes: sealed)), .integer(Self.milliseconds(expiresAt))])
    }

    public func consumeCode(codeHash: String, now: Date) async throws -> Data? {
        let rows = try await connection.query(
            "DELETE FROM issued_codes WHERE code_hash = ? AND expires_at > ? RETURNING sealed",
            [.text(codeHash), .integer(Self.milliseconds(now))])
        return rows.first?.column("sealed")?.blob.map { Data($0.readableBytesView) }
    }

    @discardableResult
    public func sweepExpired(now: Date) async throws -> Int {
        let cutoff = SQLiteData.integer(Self.milliseconds(now))
        let transactions = try await connection.query(
            "DELETE FROM authorization_transactions WHERE expires_at <= ? RETURNING 1", [cutoff])
        let codes = try await connection.query("DELETE FROM issued_codes WHERE expires_at <= ? RETURNING 1", [cutoff])
        let access = try await connection.query("DELETE FROM access_tokens WHERE expires_at <= ? RETURNING 1", [cutoff])
        let refresh = try await connection.query("DELETE FROM refresh_tokens WHERE expires_at <= ? RETURNING 1", [cutoff])
        let passthrough = try await connection.query("DELETE FROM passthrough_tokens WHERE expires_at <= ? RETURNING 1", [cutoff])
        let instances = try await connection.query("DELETE FROM instances WHERE expires_at <= ? RETURNING 1", [cutoff])
        let singleUse = try await connection.query("DELETE FROM single_use WHERE expires_at <= ? RETURNING 1", [cutoff])
        let certifications = try await connection.query("DELETE FROM certifications WHERE expires_at <= ? RETURNING 1", [cutoff])
        let sessions = try await connection.query("DELETE FROM sessions WHERE expires_at <= ? RETURNING id", [cutoff])
        for row in sessions {
            guard let id = row.column("id")?.string else { continue }
            _ = try await connection.query("DELETE FROM refresh_tokens WHERE session_id = ?", [.text(id)])
            _ = try await connection.query("DELETE FROM access_tokens WHERE session_id = ?", [.text(id)])
        }
        return transactions.count + codes.count + access.count + refresh.count + passthrough.count + sessions.count
            + instances.count + singleUse.count + certifications.count
    }

    public func checkHealth() async throws {
        _ = try await connection.query("SELECT 1", [])
    }

    static func milliseconds(_ date: Date) -> Int {
        Int((date.timeIntervalSince1970 * 1000).rounded(.down))
    }
}

/// The store's one SQLite connection: each query counted and timed by `StoreTelemetry` (one
/// connection, so a query that finds another in flight waits for it).
struct MeasuredSQLiteConnection: Sendable {
    let connection: SQLiteConnection
    let telemetry: StoreTelemetry

    @discardableResult
    func query(_ sql: String, _ binds: [SQLiteData]) async throws -> [SQLiteRow] {
        try await telemetry.measure { try await connection.query(sql, binds) }
    }

    func close() async throws {
        try await connection.close()
    }
}
