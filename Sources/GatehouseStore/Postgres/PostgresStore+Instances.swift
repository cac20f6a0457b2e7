public import Foundation
public import GatehouseCore
import PostgresNIO

extension PostgresStore {
    /// Trusted app instances: registered app instances, single-use values, paused certifications, and the
    /// DPoP key a session is bound to.
    static let instanceSchema = [
        "ALTER TABLE sessions ADD COLUMN dpop_jkt TEXT",
        "CREATE INDEX sessions_client ON sessions (client_id)",
        """
        CREATE TABLE instances (
            id TEXT PRIMARY KEY, software_id TEXT NOT NULL, dpop_jkt TEXT, certification TEXT, certified_at BIGINT,
            apple_key_id TEXT, apple_public_key BYTEA, apple_counter BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL,
            last_used_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, revoked_at BIGINT)
        """,
        "CREATE INDEX instances_software ON instances (software_id, created_at)",
        "CREATE INDEX instances_expiry ON instances (expires_at)",
        """
        CREATE TABLE single_use (kind TEXT NOT NULL, key_hash TEXT NOT NULL, value BYTEA NOT NULL, expires_at BIGINT NOT NULL,
            PRIMARY KEY (kind, key_hash))
        """,
        "CREATE INDEX single_use_expiry ON single_use (expires_at)",
        """
        CREATE TABLE certifications (id_hash TEXT PRIMARY KEY, sealed BYTEA NOT NULL, code_hash TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, verified BOOLEAN NOT NULL DEFAULT FALSE, expires_at BIGINT NOT NULL)
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
        !(try await query(
            """
            INSERT INTO instances (id, software_id, dpop_jkt, certification, certified_at, apple_key_id, apple_public_key, apple_counter,
                                   created_at, last_used_at, expires_at, revoked_at, redirect_uris)
            SELECT \(instance.id), \(instance.softwareID), \(instance.dpopJKT), \(instance.certification?.rawValue),
                   \(instance.certifiedAt.map(ms)), \(instance.appleKeyID), \(instance.applePublicKey), \(instance.appleCounter),
                   \(ms(instance.createdAt)), \(ms(instance.lastUsedAt)), \(ms(instance.expiresAt)), \(instance.revokedAt.map(ms)),
                   \(instance.redirectURIsJSON)
            WHERE (SELECT count(*) FROM instances WHERE software_id = \(instance.softwareID) AND last_used_at = created_at
                   AND expires_at > \(ms(now)) AND revoked_at IS NULL) < \(maximumPending)
            RETURNING 1
            """, logger: logger)).isEmpty
    }

    public func instanceCount() async throws -> Int {
        try await query("SELECT count(*)::BIGINT FROM instances", repeatable: true, logger: logger).first?.decode(Int.self) ?? 0
    }

    public func instance(id: String) async throws -> InstanceRecord? {
        try await instances(PostgresQuery(unsafeSQL: "SELECT \(Self.instanceColumns) FROM instances WHERE id = $1", binds: binds(id))).first
    }

    public func instances(softwareID: String?) async throws -> [InstanceRecord] {
        if let softwareID {
            return try await instances(PostgresQuery(
                unsafeSQL: "SELECT \(Self.instanceColumns) FROM instances WHERE software_id = $1 ORDER BY created_at DESC", binds: binds(softwareID)))
        }
        return try await instances(PostgresQuery(unsafeSQL: "SELECT \(Self.instanceColumns) FROM instances ORDER BY created_at DESC"))
    }

    public func touchInstance(id: String, now: Date, expiresAt: Date) async throws {
        try await query(
            """
            UPDATE instances SET last_used_at = \(ms(now)), expires_at = \(ms(expiresAt))
            WHERE id = \(id) AND revoked_at IS NULL AND expires_at > \(ms(now))
            """, repeatable: true, logger: logger)
    }

    public func certifyInstance(id: String, as certification: InstanceCertification, now: Date) async throws -> Bool {
        !(try await query(
            """
            UPDATE instances SET certification = \(certification.rawValue), certified_at = \(ms(now))
            WHERE id = \(id) AND revoked_at IS NULL AND expires_at > \(ms(now)) RETURNING 1
            """, repeatable: true, logger: logger)).isEmpty
    }

    public func certifyInstance(id: String, appleKeyID: String, publicKey: Data, counter: Int, now: Date) async throws -> Bool {
        !(try await query(
            """
            UPDATE instances SET certification = 'apple', certified_at = \(ms(now)), apple_key_id = \(appleKeyID),
                apple_public_key = \(publicKey), apple_counter = \(counter)
            WHERE id = \(id) AND revoked_at IS NULL AND expires_at > \(ms(now)) RETURNING 1
            """, repeatable: true, logger: logger)).isEmpty
    }

    public func advanceAppleCounter(id: String, to counter: Int, now: Date) async throws -> Bool {
        !(try await query(
            """
            UPDATE instances SET apple_counter = \(counter)
            WHERE id = \(id) AND apple_counter < \(counter) AND revoked_at IS NULL AND expires_at > \(ms(now)) RETURNING 1
            """, logger: logger)).isEmpty
    }

    public func revokeInstance(id: String, now: Date) async throws -> Bool {
        !(try await query("UPDATE instances SET revoked_at = \(ms(now)) WHERE id = \(id) AND revoked_at IS NULL RETURNING 1",
                          logger: logger)).isEmpty
    }

    private func instances(_ statement: PostgresQuery) async throws -> [InstanceRecord] {
        var result: [InstanceRecord] = []
        for row in try await query(statement, repeatable: true, logger: logger) {
            let c = try row.decode((String, String, String?, String?, Int?, String?, Data?, Int, Int, Int, Int, Int?, String?).self)
            result.append(InstanceRecord(
                id: c.0, softwareID: c.1, dpopJKT: c.2, certification: c.3.flatMap(InstanceCertification.init(rawValue:)),
                certifiedAt: c.4.map(Self.date), appleKeyID: c.5, applePublicKey: c.6, appleCounter: c.7, createdAt: Self.date(c.8),
                lastUsedAt: Self.date(c.9), expiresAt: Self.date(c.10), revokedAt: c.11.map(Self.date),
                redirectURIs: InstanceRecord.redirectURIs(json: c.12)))
        }
        return result
    }

    // MARK: Single use

    public func insertOnce(kind: String, keyHash: String, value: Data, expiresAt: Date, now: Date) async throws -> Bool {
        !(try await query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at) VALUES (\(kind), \(keyHash), \(value), \(ms(expiresAt)))
            ON CONFLICT (kind, key_hash) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
            WHERE single_use.expires_at <= \(ms(now)) RETURNING 1
            """, logger: logger)).isEmpty
    }

    public func insertEachOnce(kind: String, entries: [SingleUseEntry], now: Date) async throws -> Set<String> {
        guard !entries.isEmpty else { return [] }
        // In key order, so that two instances writing overlapping batches take their row locks
        // in the same order (in any other, they deadlock).
        let sorted = entries.distinctKeys.sorted { $0.keyHash < $1.keyHash }
        let keys = sorted.map(\.keyHash)
        let expiries = sorted.map { ms($0.expiresAt) }
        let rows = try await query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at)
            SELECT \(kind), key, ''::bytea, expiry FROM unnest(\(keys)::text[], \(expiries)::bigint[]) AS batch (key, expiry) ORDER BY key
            ON CONFLICT (kind, key_hash) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
            WHERE single_use.expires_at <= \(ms(now)) RETURNING key_hash
            """, logger: logger)
        var inserted: Set<String> = []
        for row in rows { inserted.insert(try row.decode(String.self)) }
        return inserted
    }

    public func consumeOnce(kind: String, keyHash: String, now: Date) async throws -> Data? {
        try await query(
            "DELETE FROM single_use WHERE kind = \(kind) AND key_hash = \(keyHash) AND expires_at > \(ms(now)) RETURNING value",
            logger: logger).first?.decode(Data.self)
    }

    // MARK: Attempt counters

    public func countAttempt(purpose: String, keyHash: String, expiresAt: Date, now: Date) async throws -> Int {
        // One statement: two instances counting at once count two.
        let kind = AttemptCounter.kind(purpose)
        let one = Data("1".utf8)
        let rows = try await query(
            """
            INSERT INTO single_use (kind, key_hash, value, expires_at) VALUES (\(kind), \(keyHash), \(one), \(ms(expiresAt)))
            ON CONFLICT (kind, key_hash) DO UPDATE SET
              value = CASE WHEN single_use.expires_at <= \(ms(now)) THEN excluded.value
                      ELSE convert_to((convert_from(single_use.value, 'UTF8')::bigint + 1)::text, 'UTF8') END,
              expires_at = CASE WHEN single_use.expires_at <= \(ms(now)) THEN excluded.expires_at ELSE single_use.expires_at END
            RETURNING value
            """, logger: logger)
        return AttemptCounter.count(decoding: try rows.first?.decode(Data.self))
    }

    public func attemptCount(purpose: String, keyHash: String, now: Date) async throws -> Int {
        let kind = AttemptCounter.kind(purpose)
        let rows = try await query(
            "SELECT value FROM single_use WHERE kind = \(kind) AND key_hash = \(keyHash) AND expires_at > \(ms(now))", repeatable: true, logger: logger)
        return AttemptCounter.count(decoding: try rows.first?.decode(Data.self))
    }

    public func discountAttempt(purpose: String, keyHash: String, now: Date) async throws {
        let kind = AttemptCounter.kind(purpose)
        try await query(
            """
            UPDATE single_use SET value = convert_to(GREATEST(convert_from(value, 'UTF8')::bigint - 1, 0)::text, 'UTF8')
            WHERE kind = \(kind) AND key_hash = \(keyHash) AND expires_at > \(ms(now))
            """, logger: logger)
    }

    public func resetAttempts(purpose: String, keyHash: String) async throws {
        let kind = AttemptCounter.kind(purpose)
        try await query("DELETE FROM single_use WHERE kind = \(kind) AND key_hash = \(keyHash)", repeatable: true, logger: logger)
    }

    // MARK: Certifications

    public func insertCertification(idHash: String, sealed: Data, codeHash: String, expiresAt: Date) async throws {
        try await query(
            "INSERT INTO certifications (id_hash, sealed, code_hash, expires_at) VALUES (\(idHash), \(sealed), \(codeHash), \(ms(expiresAt)))",
            logger: logger)
    }

    public func attemptCertification(idHash: String, codeHash: String, maximumAttempts: Int, now: Date) async throws
        -> CertificationAttempt
    {
        // One statement counts the try and compares the code: two racing tries are two tries.
        let rows = try await query(
            """
            UPDATE certifications SET attempts = attempts + 1, verified = (code_hash = \(codeHash))
            WHERE id_hash = \(idHash) AND expires_at > \(ms(now)) AND NOT verified AND attempts < \(maximumAttempts)
            RETURNING verified, attempts, sealed
            """, logger: logger)
        if let row = rows.first {
            let (verified, attempts, sealed) = try row.decode((Bool, Int, Data).self)
            return verified ? .verified(sealed) : .wrong(remaining: max(0, maximumAttempts - attempts))
        }
        let state = try await query(
            "SELECT verified, sealed FROM certifications WHERE id_hash = \(idHash) AND expires_at > \(ms(now))", repeatable: true, logger: logger)
        guard let row = state.first else { return .unknown }
        let (verified, sealed) = try row.decode((Bool, Data).self)
        return verified ? .verified(sealed) : .locked
    }

    public func consumeCertification(idHash: String, now: Date) async throws -> Data? {
        try await query(
            "DELETE FROM certifications WHERE id_hash = \(idHash) AND verified AND expires_at > \(ms(now)) RETURNING sealed",
            logger: logger).first?.decode(Data.self)
    }
}
