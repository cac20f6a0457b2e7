public import Foundation
public import GatehouseCore
import NIOCore
import SQLiteNIO

extension SQLiteAuthorizationStore: InstanceStore, SingleUseStore, CertificationStore, AttemptCounterStore {
    /// Trusted app instances: registered app instances, single-use values, paused certifications, and the
    /// DPoP key a session is bound to.
    static let instanceSchema = [
        "ALTER TABLE sessions ADD COLUMN dpop_jkt TEXT",
        "CREATE INDEX sessions_client ON sessions (client_id)",
        """
        CREATE TABLE instances (
            id TEXT PRIMARY KEY NOT NULL,
            software_id TEXT NOT NULL,
            dpop_jkt TEXT,
            certification TEXT,
            certified_at INTEGER,
            apple_key_id TEXT,
            apple_public_key BLOB,
            apple_counter INTEGER NOT NULL DEFAULT 0,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            revoked_at INTEGER
        ) WITHOUT ROWID
        """,
        "CREATE INDEX instances_software ON instances (software_id, created_at)",
        "CREATE INDEX instances_expiry ON instances (expires_at)",
        """
        CREATE TABLE single_use (
            kind TEXT NOT NULL,
            key_hash TEXT NOT NULL,
            value BLOB NOT NULL,
            expires_at INTEGER NOT NULL,
            PRIMARY KEY (kind, key_hash)
        ) WITHOUT ROWID
        """,
        "CREATE INDEX single_use_expiry ON single_use (expires_at)",
        """
        CREATE TABLE certifications (
            id_hash TEXT PRIMARY KEY NOT NULL,
            sealed BLOB NOT NULL,
            code_hash TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            verified INTEGER NOT NULL DEFAULT 0,
            expires_at INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        "CREATE INDEX certifications_expiry ON certifications (expires_at)",
    ]

    /// Registration limits: the redirect URIs an instance narrowed its app's to, and the instances
    /// of an app that never completed a sign-in (what a registration flood leaves), counted cheaply.
    static let instanceLimitsSchema = [
        "ALTER TABLE instances ADD COLUMN redirect_uris TEXT",
        "CREATE INDEX instances_pending ON instances (software_id, expires_at) WHERE last_used_at = created_at",
    ]

    private static let instanceColumns = """
        id, software_id, dpop_jkt, certification, certified_at, apple_key_id, apple_public_key, apple_counter, \
        created_at, last_used_at, expires_at, revoked_at, redirect_uris
        """

    // MARK: Instances

    public func insertInstance(_ instance: InstanceRecord, maximumPending: Int, now: Date) async throws -> Bool {
        !(try await connection.query(
            """
            INSERT INTO instances (\(Self.instanceColumns)) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
            WHERE (SELECT count(*) FROM instances WHERE software_id = ? AND last_used_at = created_at AND expires_at > ?
                   AND revoked_at IS NULL) < ?
            RETURNING 1
            """,
            [.text(instance.id), .text(instance.softwareID), instance.dpopJKT.map(SQLiteData.text) ?? .null,
             instance.certification.map { .text($0.rawValue) } ?? .null, Self.optionalTime(instance.certifiedAt),
             instance.appleKeyID.map(SQLiteData.text) ?? .null, instance.applePublicKey.map { .blob(ByteBuffer(bytes: $0)) } ?? .null,
             .integer(instance.appleCounter), .integer(Self.milliseconds(instance.createdAt)),
             .integer(Self.milliseconds(instance.lastUsedAt)), .integer(Self.milliseconds(instance.expiresAt)),
             Self.optionalTime(instance.revokedAt), instance.redirectURIsJSON.map(SQLiteData.text) ?? .null,
             .text(instance.softwareID), .integer(Self.milliseconds(now)), .integer(maximumPending)])).isEmpty
    }

    public func instanceCount() async throws -> Int {
        try await connection.query("SELECT count(*) AS n FROM instances", []).first?.column("n")?.integer ?? 0
    }

    public func instance(id: String) async throws -> InstanceRecord? {
        try await connection.query("SELECT \(Self.instanceColumns) FROM instances WHERE id = ?", [.text(id)]).first.flatMap(Self.instance)
    }

    public func instances(softwareID: String?) async throws -> [InstanceRecord] {
        let rows = if let softwareID {
            try await connection.query("SELECT \(Self.instanceColumns) FROM instances WHERE software_id = ? ORDER BY created_at DESC",
                                       [.text(softwareID)])
        } else {
            try await connection.query("SELECT \(Self.instanceColumns) FROM instances ORDER BY created_at DESC", [])
        }
        return rows.compactMap(Self.instance)
    }

    public func touchInstance(id: String, now: Date, expiresAt: Date) async throws {
        try await connection.query(
            "UPDATE instances SET last_used_at = ?, expires_at = ? WHERE id = ? AND revoked_at IS NULL AND expires_at > ?",
            [.integer(Self.milliseconds(now)), .integer(Self.milliseconds(expiresAt)), .text(id), .integer(Self.milliseconds(now))])
    }

    public func certifyInstance(id: String, as certification: InstanceCertification, now: Date) async throws -> Bool {
        !(try await connection.query(
            "UPDATE instances SET certification = ?, certified_at = ? WHERE id = ? AND revoked_at IS NULL AND expires_at > ? RETURNING 1",
            [.text(certification.rawValue), .integer(Self.milliseconds(now)), .text(id), .integer(Self.milliseconds(now))])).isEmpty
    }

    public func certifyInstance(id: String, appleKeyID: String, publicKey: Data, counter: Int, now: Date) async throws -> Bool {
        !(try await connection.query(
            """
            UPDATE instances SET certification = 'apple', certified_at = ?, apple_key_id = ?, apple_public_key = ?, apple_counter = ?
            WHERE id = ? AND revoked_at IS NULL AND expires_at > ? RETURNING 1
            """,
            [.integer(Self.milliseconds(now)), .text(appleKeyID), .blob(ByteBuffer(bytes: publicKey)), .integer(counter), .text(id),
             .integer(Self.milliseconds(now))])).isEmpty
    }

    public func advanceAppleCounter(id: String, to counter: Int, now: Date) async throws -> Bool {
        !(try await connection.query(
            """
            UPDATE instances SET apple_counter = ?
            WHERE id = ? AND apple_counter < ? AND revoked_at IS NULL AND expires_at > ? RETURNING 1
            """,
            [.integer(counter), .text(id), .integer(counter), .integer(Self.milliseconds(now))])).isEmpty
    }

    public func revokeInstance(id: String, now: Date) async throws -> Bool {
        !(try await connection.query("UPDATE instances SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL RETURNING 1",
                                     [.integer(Self.milliseconds(now)), .text(id)])).isEmpty
    }

    private static func instance(_ row: SQLiteRow) -> InstanceRecord? {
        guard let id = row.column("id")?.string, let software = row.column("software_id")?.string,
              let created = row.column("created_at")?.integer, let used = row.column("last_used_at")?.integer,
              let expires = row.column("expires_at")?.integer else { return nil }
        return InstanceRecord(
            id: id, softwareID: software, dpopJKT: row.column("dpop_jkt")?.string,
            certification: row.column("certification")?.string.flatMap(InstanceCertification.init(rawValue:)),
            certifiedAt: row.column("certified_at")?.integer.map(date), appleKeyID: row.column("apple_key_id")?.string,
            applePublicKey: row.column("apple_public_key")?.blob.map { Data($0.readableBytesView) },
            appleCounter: row.column("apple_counter")?.integer ?? 0, createdAt: date(created), lastUsedAt: date(used),
            expiresAt: date(expires), revokedAt: row.column("revoked_at")?.integer.map(date),
            redirectURIs: InstanceRecord.redirectURIs(json: row.column("redirect_uris")?.string))
    }

    // MARK: Single use

    public func insertOnce(kind: String, keyHash: String, value: Data, expiresAt: Date, now: Date) async throws -> Bool {
        !(try await connection.query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (kind, key_hash) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
            WHERE single_use.expires_at <= ? RETURNING 1
            """,
            [.text(kind), .text(keyHash), .blob(ByteBuffer(bytes: value)), .integer(Self.milliseconds(expiresAt)),
             .integer(Self.milliseconds(now))])).isEmpty
    }

    public func insertEachOnce(kind: String, entries: [SingleUseEntry], now: Date) async throws -> Set<String> {
        let entries = entries.distinctKeys
        guard !entries.isEmpty else { return [] }
        var binds: [SQLiteData] = []
        binds.reserveCapacity(entries.count * 3 + 1)
        for entry in entries {
            binds += [.text(kind), .text(entry.keyHash), .integer(Self.milliseconds(entry.expiresAt))]
        }
        binds.append(.integer(Self.milliseconds(now)))
        let rows = try await connection.query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at) VALUES \(Array(repeating: "(?, ?, X'', ?)", count: entries.count).joined(separator: ", "))
            ON CONFLICT (kind, key_hash) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
            WHERE single_use.expires_at <= ? RETURNING key_hash
            """, binds)
        return Set(rows.compactMap { $0.column("key_hash")?.string })
    }

    public func consumeOnce(kind: String, keyHash: String, now: Date) async throws -> Data? {
        try await connection.query(
            "DELETE FROM single_use WHERE kind = ? AND key_hash = ? AND expires_at > ? RETURNING value",
            [.text(kind), .text(keyHash), .integer(Self.milliseconds(now))]).first?.column("value")?.blob.map { Data($0.readableBytesView) }
    }

    // MARK: Attempt counters

    public func countAttempt(purpose: String, keyHash: String, expiresAt: Date, now: Date) async throws -> Int {
        // One statement: two instances counting at once count two.
        let rows = try await connection.query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at) VALUES (?, ?, CAST('1' AS BLOB), ?)
            ON CONFLICT (kind, key_hash) DO UPDATE SET
              value = CASE WHEN single_use.expires_at <= ? THEN CAST('1' AS BLOB)
                      ELSE CAST(CAST(CAST(CAST(single_use.value AS TEXT) AS INTEGER) + 1 AS TEXT) AS BLOB) END,
              expires_at = CASE WHEN single_use.expires_at <= ? THEN excluded.expires_at ELSE single_use.expires_at END
            RETURNING value
            """,
            [.text(AttemptCounter.kind(purpose)), .text(keyHash), .integer(Self.milliseconds(expiresAt)),
             .integer(Self.milliseconds(now)), .integer(Self.milliseconds(now))])
        return AttemptCounter.count(decoding: rows.first?.column("value")?.blob.map { Data($0.readableBytesView) })
    }

    public func attemptCount(purpose: String, keyHash: String, now: Date) async throws -> Int {
        let rows = try await connection.query(
            "SELECT value FROM single_use WHERE kind = ? AND key_hash = ? AND expires_at > ?",
            [.text(AttemptCounter.kind(purpose)), .text(keyHash), .integer(Self.milliseconds(now))])
        return AttemptCounter.count(decoding: rows.first?.column("value")?.blob.map { Data($0.readableBytesView) })
    }

    public func discountAttempt(purpose: String, keyHash: String, now: Date) async throws {
        try await connection.query(
            """
            UPDATE single_use SET value = CAST(CAST(MAX(CAST(CAST(value AS TEXT) AS INTEGER) - 1, 0) AS TEXT) AS BLOB)
            WHERE kind = ? AND key_hash = ? AND expires_at > ?
            """,
            [.text(AttemptCounter.kind(purpose)), .text(keyHash), .integer(Self.milliseconds(now))])
    }

    public func resetAttempts(purpose: String, keyHash: String) async throws {
        try await connection.query("DELETE FROM single_use WHERE kind = ? AND key_hash = ?", [.text(AttemptCounter.kind(purpose)), .text(keyHash)])
    }

    // MARK: Certifications

    public func insertCertification(idHash: String, sealed: Data, codeHash: String, expiresAt: Date) async throws {
        try await connection.query(
            "INSERT INTO certifications (id_hash, sealed, code_hash, expires_at) VALUES (?, ?, ?, ?)",
            [.text(idHash), .blob(ByteBuffer(bytes: sealed)), .text(codeHash), .integer(Self.milliseconds(expiresAt))])
    }

    public func attemptCertification(idHash: String, codeHash: String, maximumAttempts: Int, now: Date) async throws
        -> CertificationAttempt
    {
        // One statement counts the try and compares the code: two racing tries are two tries.
        let rows = try await connection.query(
            """
            UPDATE certifications SET attempts = attempts + 1, verified = (code_hash = ?)
            WHERE id_hash = ? AND expires_at > ? AND verified = 0 AND attempts < ?
            RETURNING verified, attempts, sealed
            """,
            [.text(codeHash), .text(idHash), .integer(Self.milliseconds(now)), .integer(maximumAttempts)])
        if let row = rows.first {
            if row.column("verified")?.integer == 1, let sealed = row.column("sealed")?.blob {
                return .verified(Data(sealed.readableBytesView))
            }
            return .wrong(remaining: max(0, maximumAttempts - (row.column("attempts")?.integer ?? maximumAttempts)))
        }
        let state = try await connection.query(
            "SELECT verified, attempts, sealed FROM certifications WHERE id_hash = ? AND expires_at > ?",
            [.text(idHash), .integer(Self.milliseconds(now))])
        guard let row = state.first else { return .unknown }
        if row.column("verified")?.integer == 1, let sealed = row.column("sealed")?.blob { return .verified(Data(sealed.readableBytesView)) }
        return .locked
    }

    public func consumeCertification(idHash: String, now: Date) async throws -> Data? {
        try await connection.query(
            "DELETE FROM certifications WHERE id_hash = ? AND verified = 1 AND expires_at > ? RETURNING sealed",
            [.text(idHash), .integer(Self.milliseconds(now))]).first?.column("sealed")?.blob.map { Data($0.readableBytesView) }
    }
}
