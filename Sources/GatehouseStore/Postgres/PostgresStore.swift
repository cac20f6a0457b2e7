public import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import NIOSSL
import Synchronization
public import PostgresNIO

/// The shared store for several Gatehouse instances behind a load balancer: PostgreSQL
/// through PostgresNIO's pooled client (run it as a service of the process).
///
/// Single use, rotation, leases and fencing are each one statement (`DELETE … RETURNING`,
/// `UPDATE … WHERE … RETURNING`), atomic across every instance sharing the database.
public final class PostgresStore: AuthorizationStore, SessionStore, PassthroughTokenStore, RevocationAnnouncer, InstanceStore,
    SingleUseStore, CertificationStore, AttemptCounterStore {
    /// The servers of `store.postgres` and their pools (run it as a service of the process).
    public let database: PostgresServers
    let logger: Logger
    let telemetry: StoreTelemetry
    /// The database's time (ms) until which this instance heard every revocation: its channel was
    /// up then, or the migrations ran then, before it served anything (nil before either). Where
    /// a catch-up read starts.
    let revocationsHeardUntil = Mutex<Int?>(nil)

    /// `poolSize`: the connections each host's pool may use for queries (`store.postgres.pool_size`),
    /// for `gatehouse_store_lease_waits_total`; `nil` counts no waits.
    public init(database: PostgresServers, poolSize: Int? = nil, logger: Logger) {
        self.database = database
        self.logger = logger
        self.telemetry = StoreTelemetry(store: "postgres", poolSize: poolSize)
    }

    /// A store on one server's pool, which the caller runs.
    public convenience init(client: PostgresClient, poolSize: Int? = nil, logger: Logger) {
        self.init(database: PostgresServers(servers: [.init(endpoint: "postgres", client: client)], logger: logger), poolSize: poolSize,
                  logger: logger)
    }

    // MARK: Migrations

    /// Applies the migrations this database has not seen, under an advisory lock so instances
    /// starting together apply each exactly once.
    ///
    /// Notes the database's clock too: the first LISTEN reads what was revoked since, so nothing
    /// this instance cached before it listened escapes a revocation.
    public func migrate() async throws {
        let logger = self.logger
        try await database.withConnection { connection in
            try await connection.withTransaction(logger: logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(72657301)", logger: logger)
                try await connection.query("CREATE TABLE IF NOT EXISTS gatehouse_migrations (version INTEGER PRIMARY KEY)", logger: logger)
                var applied = 0
                for try await version in try await connection.query("SELECT COALESCE(MAX(version), 0) FROM gatehouse_migrations", logger: logger)
                    .decode(Int.self) { applied = version }
                for (index, migration) in Self.migrations.enumerated() where index >= applied {
                    for statement in migration { try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger) }
                    try await connection.query("INSERT INTO gatehouse_migrations (version) VALUES (\(index + 1))", logger: logger)
                }
            }
        }
        let clock = try await query(PostgresQuery(unsafeSQL: "SELECT \(Self.databaseNow)"), repeatable: true, logger: logger)
        if let now = try clock.first?.decode(Int.self) {
            revocationsHeardUntil.withLock { $0 = $0 ?? now }
        }
    }

    /// Versioned schema changes, in order. Append; never edit a released one.
    static let migrations: [[String]] = [
        [
            "CREATE TABLE authorization_transactions (state_hash TEXT PRIMARY KEY, payload BYTEA NOT NULL, expires_at BIGINT NOT NULL)",
            "CREATE INDEX authorization_transactions_expiry ON authorization_transactions (expires_at)",
            "CREATE TABLE issued_codes (code_hash TEXT PRIMARY KEY, sealed BYTEA NOT NULL, expires_at BIGINT NOT NULL)",
            "CREATE INDEX issued_codes_expiry ON issued_codes (expires_at)",
        ],
        [
            """
            CREATE TABLE sessions (
                id TEXT PRIMARY KEY, client_id TEXT NOT NULL, upstream TEXT NOT NULL, subject TEXT, key_id TEXT NOT NULL,
                sealed_tokens BYTEA NOT NULL, upstream_expires_at BIGINT, version INTEGER NOT NULL, created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL, revoked_at BIGINT, lease_owner TEXT, lease_until BIGINT)
            """,
            "CREATE INDEX sessions_subject ON sessions (subject)",
            "CREATE TABLE access_tokens (hash TEXT PRIMARY KEY, session_id TEXT NOT NULL, expires_at BIGINT NOT NULL)",
            "CREATE INDEX access_tokens_session ON access_tokens (session_id)",
            """
            CREATE TABLE refresh_tokens (hash TEXT PRIMARY KEY, session_id TEXT NOT NULL, expires_at BIGINT NOT NULL,
                replaced_at BIGINT, successor_sealed BYTEA)
            """,
            "CREATE INDEX refresh_tokens_session ON refresh_tokens (session_id)",
        ],
        [
            """
            CREATE TABLE passthrough_tokens (hash TEXT PRIMARY KEY, client_id TEXT NOT NULL, upstream TEXT NOT NULL,
                expires_at BIGINT NOT NULL, lease_owner TEXT, lease_until BIGINT, answered_at BIGINT, answer_sealed BYTEA,
                rotated BOOLEAN NOT NULL DEFAULT FALSE)
            """,
            "CREATE INDEX passthrough_tokens_expiry ON passthrough_tokens (expires_at)",
        ],
        instanceSchema,
        instanceLimitsSchema,
        revocationsSchema,
    ]

    // MARK: Authorization state

    public func insertTransaction(sealed: Data, stateHash: String, expiresAt: Date) async throws {
        try await query(
            "INSERT INTO authorization_transactions (state_hash, payload, expires_at) VALUES (\(stateHash), \(sealed), \(ms(expiresAt)))",
            logger: logger)
    }

    public func consumeTransaction(stateHash: String, now: Date) async throws -> Data? {
        let rows = try await query(
            "DELETE FROM authorization_transactions WHERE state_hash = \(stateHash) AND expires_at > \(ms(now)) RETURNING payload", logger: logger)
        return try rows.first?.decode(Data.self)
    }

    public func insertCode(sealed: Data, codeHash: String, expiresAt: Date) async throws {
        try await query("INSERT INTO issued_codes (code_hash, sealed, expires_at) VALUES (\(codeHash), \(sealed), \(ms(expiresAt)))",
                               logger: logger)
    }

    public func consumeCode(codeHash: String, now: Date) async throws -> Data? {
        let rows = try await query(
            "DELETE FROM issued_codes WHERE code_hash = \(codeHash) AND expires_at > \(ms(now)) RETURNING sealed", logger: logger)
        return try rows.first?.decode(Data.self)
    }

    @discardableResult
    public func sweepExpired(now: Date) async throws -> Int {
        let cutoff = ms(now)
        var removed = 0
        for table in ["authorization_transactions", "issued_codes", "access_tokens", "refresh_tokens", "passthrough_tokens",
                      "instances", "single_use", "certifications", "revocations"] {
            removed += try await count(query(PostgresQuery(unsafeSQL: "DELETE FROM \(table) WHERE expires_at <= $1 RETURNING 1", binds: binds(cutoff)), repeatable: true, logger: logger))
        }
        // Not repeatable: sent again after it committed, it would return no ids and leave their tokens.
        let ended = try await query("DELETE FROM sessions WHERE expires_at <= \(cutoff) RETURNING id", logger: logger)
        for row in ended {
            let id = try row.decode(String.self)
            removed += 1
            try await query("DELETE FROM refresh_tokens WHERE session_id = \(id)", repeatable: true, logger: logger)
            try await query("DELETE FROM access_tokens WHERE session_id = \(id)", repeatable: true, logger: logger)
        }
        return removed
    }

    public func checkHealth() async throws {
        try await query("SELECT 1", repeatable: true, logger: logger)
    }

    // MARK: Sessions

    public func insertSession(_ session: SessionRecord) async throws {
        try await query(
            """
            INSERT INTO sessions (id, client_id, upstream, subject, key_id, sealed_tokens, upstream_expires_at, version, created_at, expires_at, revoked_at,
                                  dpop_jkt)
            VALUES (\(session.id), \(session.clientID), \(session.upstream), \(session.subject), \(session.keyID), \(session.sealedTokens),
                    \(session.upstreamExpiresAt.map(ms)), \(session.version), \(ms(session.createdAt)), \(ms(session.expiresAt)), \(session.revokedAt.map(ms)),
                    \(session.dpopJKT))
            """, logger: logger)
    }

    private static let columns =
        "s.id, s.client_id, s.upstream, s.subject, s.key_id, s.sealed_tokens, s.upstream_expires_at, s.version, s.created_at, s.expires_at, s.revoked_at, s.lease_owner, s.lease_until, s.dpop_jkt"

    public func session(id: String) async throws -> SessionRecord? {
        try await sessions(PostgresQuery(unsafeSQL: "SELECT \(Self.columns) FROM sessions s WHERE s.id = $1", binds: binds(id))).first
    }

    public func session(forAccessTokenHash hash: String, now: Date) async throws -> (session: SessionRecord, accessExpiresAt: Date)? {
        let rows = try await query(PostgresQuery(unsafeSQL: """
            SELECT \(Self.columns), a.expires_at FROM access_tokens a JOIN sessions s ON s.id = a.session_id
            WHERE a.hash = $1 AND a.expires_at > $2 AND s.revoked_at IS NULL AND s.expires_at > $2
            """, binds: binds(hash, ms(now))), repeatable: true, logger: logger)
        guard let row = rows.first else { return nil }
        let c = try row.decode((String, String, String, String?, String, Data, Int?, Int, Int, Int, Int?, String?, Int?, String?, Int).self)
        return (Self.session(c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, c.8, c.9, c.10, c.11, c.12, c.13), Self.date(c.14))
    }

    public func insertAccessToken(hash: String, sessionID: String, expiresAt: Date) async throws {
        try await query("INSERT INTO access_tokens (hash, session_id, expires_at) VALUES (\(hash), \(sessionID), \(ms(expiresAt)))", logger: logger)
    }

    public func insertRefreshToken(hash: String, sessionID: String, expiresAt: Date) async throws {
        try await query("INSERT INTO refresh_tokens (hash, session_id, expires_at) VALUES (\(hash), \(sessionID), \(ms(expiresAt)))", logger: logger)
    }

    public func refreshToken(hash: String) async throws -> RefreshTokenRecord? {
        let rows = try await query(
            "SELECT hash, session_id, expires_at, replaced_at, successor_sealed FROM refresh_tokens WHERE hash = \(hash)", repeatable: true, logger: logger)
        guard let row = rows.first else { return nil }
        let (hash, session, expires, replaced, successor) = try row.decode((String, String, Int, Int?, Data?).self)
        return RefreshTokenRecord(hash: hash, sessionID: session, expiresAt: Self.date(expires), replacedAt: replaced.map(Self.date),
                                  successorSealed: successor)
    }

    public func markRefreshTokenReplaced(hash: String, successorSealed: Data, now: Date) async throws -> Bool {
        try await count(query(
            """
            UPDATE refresh_tokens SET replaced_at = \(ms(now)), successor_sealed = \(successorSealed)
            WHERE hash = \(hash) AND replaced_at IS NULL AND expires_at > \(ms(now)) RETURNING 1
            """, logger: logger)) > 0
    }

    public func deleteTokens(accessHash: String, refreshHash: String) async throws {
        try await query("DELETE FROM access_tokens WHERE hash = \(accessHash)", repeatable: true, logger: logger)
        try await query("DELETE FROM refresh_tokens WHERE hash = \(refreshHash)", repeatable: true, logger: logger)
    }

    public func revokeSession(id: String, now: Date) async throws {
        try await query("UPDATE sessions SET revoked_at = \(ms(now)) WHERE id = \(id) AND revoked_at IS NULL", repeatable: true, logger: logger)
        try await query("DELETE FROM access_tokens WHERE session_id = \(id)", repeatable: true, logger: logger)
    }

    public func revokeSession(id: String, ifVersion version: Int, now: Date) async throws -> Bool {
        let ended = try await count(query(
            "UPDATE sessions SET revoked_at = \(ms(now)) WHERE id = \(id) AND version = \(version) AND revoked_at IS NULL RETURNING 1",
            logger: logger)) > 0
        if ended { try await query("DELETE FROM access_tokens WHERE session_id = \(id)", repeatable: true, logger: logger) }
        return ended
    }

    public func rewrapSession(id: String, expectedVersion: Int, fromKeyID: String, keyID: String, sealed: Data, now: Date) async throws -> Bool {
        try await count(query(
            """
            UPDATE sessions SET key_id = \(keyID), sealed_tokens = \(sealed)
            WHERE id = \(id) AND version = \(expectedVersion) AND key_id = \(fromKeyID)
              AND (lease_until IS NULL OR lease_until <= \(ms(now))) RETURNING 1
            """, logger: logger)) > 0
    }

    public func acquireRefreshLease(sessionID: String, owner: String, until: Date, now: Date) async throws -> Bool {
        try await count(query(
            """
            UPDATE sessions SET lease_owner = \(owner), lease_until = \(ms(until))
            WHERE id = \(sessionID) AND revoked_at IS NULL AND (lease_until IS NULL OR lease_until <= \(ms(now)) OR lease_owner = \(owner))
            RETURNING 1
            """, repeatable: true, logger: logger)) > 0
    }

    public func releaseRefreshLease(sessionID: String, owner: String) async throws {
        try await query("UPDATE sessions SET lease_owner = NULL, lease_until = NULL WHERE id = \(sessionID) AND lease_owner = \(owner)",
                               repeatable: true, logger: logger)
    }

    public func writeUpstreamTokens(sessionID: String, expectedVersion: Int, keyID: String, sealed: Data, upstreamExpiresAt: Date?) async throws -> Bool {
        try await count(query(
            """
            UPDATE sessions SET key_id = \(keyID), sealed_tokens = \(sealed), upstream_expires_at = \(upstreamExpiresAt.map(ms)),
                version = version + 1, lease_owner = NULL, lease_until = NULL
            WHERE id = \(sessionID) AND version = \(expectedVersion) AND revoked_at IS NULL RETURNING 1
            """, logger: logger)) > 0
    }

    public func setSubject(_ subject: String, sessionID: String) async throws {
        try await query("UPDATE sessions SET subject = \(subject) WHERE id = \(sessionID)", repeatable: true, logger: logger)
    }

    public func sessions(subject: String?) async throws -> [SessionRecord] {
        if let subject {
            return try await sessions(PostgresQuery(unsafeSQL: "SELECT \(Self.columns) FROM sessions s WHERE s.subject = $1 ORDER BY s.created_at", binds: binds(subject)))
        }
        return try await sessions(PostgresQuery(unsafeSQL: "SELECT \(Self.columns) FROM sessions s ORDER BY s.created_at"))
    }

    public func sessions(clientID: String) async throws -> [SessionRecord] {
        try await sessions(PostgresQuery(unsafeSQL: "SELECT \(Self.columns) FROM sessions s WHERE s.client_id = $1 ORDER BY s.created_at",
                                         binds: binds(clientID)))
    }

    public func sessionsSealed(notUnder activeKeyID: String, limit: Int) async throws -> [SessionRecord] {
        try await sessions(PostgresQuery(unsafeSQL: "SELECT \(Self.columns) FROM sessions s WHERE s.key_id <> $1 AND s.revoked_at IS NULL LIMIT $2",
                                         binds: binds(activeKeyID, limit)))
    }

    // MARK: Passthrough tokens

    public func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws {
        guard !tokens.isEmpty else { return }
        // One statement for the pair (one round trip on a refresh's critical path), in hash order
        // so that two writers of overlapping pairs take their row locks in the same order.
        let sorted = tokens.sorted { $0.hash < $1.hash }
        let hashes = sorted.map(\.hash)
        let expiries = sorted.map { ms($0.expiresAt) }
        try await query(
            """
            INSERT INTO passthrough_tokens (hash, client_id, upstream, expires_at)
            SELECT hash, \(clientID), \(upstream), expiry FROM unnest(\(hashes)::text[], \(expiries)::bigint[]) AS pair (hash, expiry)
            ON CONFLICT (hash) DO NOTHING
            """, repeatable: true, logger: logger)
    }

    public func passthroughToken(hash: String) async throws -> PassthroughTokenRecord? {
        let rows = try await query(
            """
            SELECT hash, client_id, upstream, expires_at, lease_owner, lease_until, answered_at, answer_sealed, rotated
            FROM passthrough_tokens WHERE hash = \(hash)
            """, repeatable: true, logger: logger)
        guard let row = rows.first else { return nil }
        let c = try row.decode((String, String, String, Int, String?, Int?, Int?, Data?, Bool).self)
        return PassthroughTokenRecord(hash: c.0, clientID: c.1, upstream: c.2, expiresAt: Self.date(c.3), leaseOwner: c.4,
                                      leaseUntil: c.5.map(Self.date), answeredAt: c.6.map(Self.date), answerSealed: c.7, rotated: c.8)
    }

    /// One statement: the lease is taken by the `UPDATE` of a data-modifying CTE, whose condition
    /// is `acquirePassthroughRefresh`'s (under READ COMMITTED a row changed since the snapshot is
    /// judged again in its latest version, so two attempts cannot both take it); the row the
    /// update left is returned when it took the lease, the row as read otherwise.
    public func readPassthroughRefresh(hash: String, clientID: String, owner: String, until: Date, now: Date,
                                       answeredBefore: Date) async throws -> PassthroughLeaseAttempt {
        let rows = try await query(
            """
            WITH current AS (
                SELECT hash, client_id, upstream, expires_at, lease_owner, lease_until, answered_at, answer_sealed, rotated
                FROM passthrough_tokens WHERE hash = \(hash)
            ), leased AS (
                UPDATE passthrough_tokens AS t SET lease_owner = \(owner), lease_until = \(ms(until)),
                    answered_at = NULL, answer_sealed = NULL, rotated = FALSE
                WHERE t.hash = \(hash) AND t.client_id = \(clientID)
                  AND (t.lease_until IS NULL OR t.lease_until <= \(ms(now)) OR t.lease_owner = \(owner))
                  AND (t.answered_at IS NULL OR (NOT t.rotated AND t.answer_sealed IS NOT NULL AND t.answered_at < \(ms(answeredBefore))))
                RETURNING t.hash, t.client_id, t.upstream, t.expires_at, t.lease_owner, t.lease_until, t.answered_at, t.answer_sealed, t.rotated
            )
            SELECT *, TRUE AS leased FROM leased
            UNION ALL
            SELECT *, FALSE AS leased FROM current WHERE NOT EXISTS (SELECT 1 FROM leased)
            """, repeatable: true, logger: logger)
        guard let row = rows.first else { return PassthroughLeaseAttempt(record: nil, leased: false) }
        let c = try row.decode((String, String, String, Int, String?, Int?, Int?, Data?, Bool, Bool).self)
        return PassthroughLeaseAttempt(
            record: PassthroughTokenRecord(hash: c.0, clientID: c.1, upstream: c.2, expiresAt: Self.date(c.3), leaseOwner: c.4,
                                           leaseUntil: c.5.map(Self.date), answeredAt: c.6.map(Self.date), answerSealed: c.7, rotated: c.8),
            leased: c.9)
    }

    public func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                          answeredBefore: Date, expiresAt: Date) async throws -> Bool {
        try await count(query(
            """
            INSERT INTO passthrough_tokens AS t (hash, client_id, upstream, expires_at, lease_owner, lease_until)
            VALUES (\(hash), \(clientID), \(upstream), \(ms(expiresAt)), \(owner), \(ms(until)))
            ON CONFLICT (hash) DO UPDATE SET lease_owner = excluded.lease_owner, lease_until = excluded.lease_until,
                answered_at = NULL, answer_sealed = NULL, rotated = FALSE
            WHERE t.client_id = excluded.client_id
              AND (t.lease_until IS NULL OR t.lease_until <= \(ms(now)) OR t.lease_owner = excluded.lease_owner)
              AND (t.answered_at IS NULL OR (NOT t.rotated AND t.answer_sealed IS NOT NULL AND t.answered_at < \(ms(answeredBefore))))
            RETURNING 1
            """, repeatable: true, logger: logger)) > 0
    }

    public func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool {
        try await count(query(
            """
            UPDATE passthrough_tokens SET answered_at = \(ms(now)), answer_sealed = \(sealed), rotated = \(rotated),
                lease_owner = NULL, lease_until = NULL, expires_at = \(ms(keepUntil))
            WHERE hash = \(hash) AND (answered_at IS NULL OR (answer_sealed IS NULL AND \(sealed != nil))) RETURNING 1
            """, logger: logger)) > 0
    }

    public func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws {
        if forget {
            try await query("DELETE FROM passthrough_tokens WHERE hash = \(hash) AND lease_owner = \(owner) AND answered_at IS NULL", repeatable: true, logger: logger)
        } else {
            try await query("UPDATE passthrough_tokens SET lease_owner = NULL, lease_until = NULL WHERE hash = \(hash) AND lease_owner = \(owner)",
                            repeatable: true, logger: logger)
        }
    }

    // MARK: Revocations across instances

    /// The channel revocations are announced on.
    static let revocationChannel = "gatehouse_revocations"

    /// Each announcement is also kept this long (`revocations`), for an instance whose channel
    /// was down when it was made (a failover, a restart of the database) to read on its return:
    /// 24 h, the longest an identity-cache entry may live (`identity.cache_ttl`).
    static let revocationRetention = 24 * 60 * 60 * 1000

    /// How far before the last moment an instance knew its channel was up it reads again on its
    /// return: the two servers' clocks of a failover may differ, and a message read twice is harmless.
    static let catchUpMargin = 5_000

    /// The database's clock, in milliseconds (one clock for every instance, whatever theirs say).
    static let databaseNow = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    static let revocationsSchema = [
        "CREATE TABLE revocations (id BIGSERIAL PRIMARY KEY, message TEXT NOT NULL, announced_at BIGINT NOT NULL, expires_at BIGINT NOT NULL)",
        "CREATE INDEX revocations_announced ON revocations (announced_at)",
    ]

    /// Kept and announced in one statement: the NOTIFY is sent when the row commits.
    public func announceRevocation(_ message: String) async throws {
        try await query(PostgresQuery(unsafeSQL: """
            WITH kept AS (
                INSERT INTO revocations (message, announced_at, expires_at)
                VALUES ($2, \(Self.databaseNow), \(Self.databaseNow) + \(Self.revocationRetention))
            )
            SELECT pg_notify($1, $2)
            """, binds: binds(Self.revocationChannel, message)), repeatable: true, logger: logger)
    }

    /// Calls `handle` with every revocation announced by any instance, until cancelled or the
    /// connection fails (the caller listens again). `onListening` runs once the LISTEN is in place.
    ///
    /// When it listens again, it first reads the revocations kept since the channel was last known
    /// to be up (less `catchUpMargin`), so what was announced while it was down still arrives.
    ///
    /// The connection is checked every `heartbeat` (a half-open connection, after a failover or a
    /// NAT timeout, would otherwise deliver nothing and raise no error): a failed check ends the call.
    public func listenForRevocations(heartbeat: Duration = .seconds(5), onListening: @escaping @Sendable () -> Void,
                                     _ handle: @escaping @Sendable (String) async -> Void) async throws {
        let logger = self.logger
        // A statement first, under its deadline: with the primary gone and no connection open, the
        // pool would make the LISTEN's connection wait; this fails instead, and looks for the primary.
        try await query("SELECT 1", repeatable: true, logger: logger)
        try await database.withConnection { connection in
            @Sendable func databaseNow() async throws -> Int {
                try await withDeadline(Self.queryTimeout, orThrow: { StoreUnavailable() }) {
                    let rows = try await PostgresServers.send(PostgresQuery(unsafeSQL: "SELECT \(Self.databaseNow)"), on: connection, logger: logger)
                    return try rows.first?.decode(Int.self) ?? 0
                }
            }
            // PostgresNIO's LISTEN does not end when cancelled: closing the connection ends it.
            try await withTaskCancellationHandler {
                try await connection.listen(on: Self.revocationChannel) { notifications in
                    // From here every announcement reaches `notifications`; what came before is in the table.
                    let listening = try await databaseNow()
                    if let since = self.revocationsHeardUntil.withLock({ $0 }) {
                        let missed = try await withDeadline(Self.queryTimeout, orThrow: { StoreUnavailable() }) {
                            let statement: PostgresQuery = "SELECT message FROM revocations WHERE announced_at >= \(since - Self.catchUpMargin) ORDER BY id"
                            var messages: [String] = []
                            for row in try await PostgresServers.send(statement, on: connection, logger: logger) { messages.append(try row.decode(String.self)) }
                            return messages
                        }
                        if !missed.isEmpty {
                            logger.notice("read the revocations announced while the channel was down", metadata: ["count": "\(missed.count)"])
                        }
                        for message in missed { await handle(message) }
                    }
                    self.revocationsHeardUntil.withLock { $0 = listening }
                    onListening()
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask {
                            for try await notification in notifications { await handle(notification.payload) }
                        }
                        group.addTask {
                            while true {
                                try await Task.sleep(for: heartbeat)
                                let now = try await databaseNow()
                                self.revocationsHeardUntil.withLock { $0 = now }
                            }
                        }
                        defer { group.cancelAll() }
                        try await group.next()
                    }
                }
            } onCancel: {
                let closing: EventLoopFuture<Void> = connection.close()
                closing.whenComplete { _ in }
            }
        }
    }

    // MARK: Helpers

    /// How long a query may wait for a connection and its answer: during an outage the app
    /// gets a quick 503 instead of a request that hangs until the database returns.
    static let queryTimeout: Duration = .seconds(2)

    /// Runs one statement and reads its rows (the connection goes back to the pool with the
    /// last row): every query of the store but the migrations and the LISTEN passes here, counted
    /// and timed by `telemetry`.
    ///
    /// `repeatable`: the statement may be sent again when its connection ended before the answer
    /// (a read, or a write whose second run changes nothing and answers as the first did);
    /// otherwise such a failure is `StoreUnavailable` (see `PostgresServers`).
    @discardableResult
    func query(_ query: PostgresQuery, repeatable: Bool = false, logger: Logger) async throws -> [PostgresRow] {
        let database = self.database
        return try await telemetry.measure {
            do {
                return try await withDeadline(Self.queryTimeout, orThrow: { StoreUnavailable() }) {
                    try await database.query(query, repeatable: repeatable, logger: logger)
                }
            } catch let error as StoreUnavailable where error.reason == .timeout {
                database.lookAgain()
                throw error
            }
        }
    }

    private func sessions(_ statement: PostgresQuery) async throws -> [SessionRecord] {
        var result: [SessionRecord] = []
        let rows = try await query(statement, repeatable: true, logger: logger)
        for row in rows {
            let c = try row.decode((String, String, String, String?, String, Data, Int?, Int, Int, Int, Int?, String?, Int?, String?).self)
            result.append(Self.session(c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, c.8, c.9, c.10, c.11, c.12, c.13))
        }
        return result
    }

    private static func session(_ id: String, _ client: String, _ upstream: String, _ subject: String?, _ keyID: String, _ sealed: Data,
                                _ upstreamExpires: Int?, _ version: Int, _ created: Int, _ expires: Int, _ revoked: Int?,
                                _ leaseOwner: String?, _ leaseUntil: Int?, _ dpopJKT: String?) -> SessionRecord {
        SessionRecord(id: id, clientID: client, upstream: upstream, subject: subject, keyID: keyID, sealedTokens: sealed,
                      upstreamExpiresAt: upstreamExpires.map(date), version: version, createdAt: date(created), expiresAt: date(expires),
                      revokedAt: revoked.map(date), leaseOwner: leaseOwner, leaseUntil: leaseUntil.map(date), dpopJKT: dpopJKT)
    }

    private func count(_ rows: [PostgresRow]) -> Int {
        rows.count
    }

    func binds(_ values: any PostgresEncodable...) -> PostgresBindings {
        var bindings = PostgresBindings()
        for value in values { try? bindings.append(value) }
        return bindings
    }

    func ms(_ date: Date) -> Int { Int((date.timeIntervalSince1970 * 1000).rounded(.down)) }
    static func date(_ milliseconds: Int) -> Date { Date(timeIntervalSince1970: Double(milliseconds) / 1000) }
}

