public import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import NIOSSL
public import PostgresNIO
public import ServiceLifecycle
import Synchronization

/// The PostgreSQL servers of `store.postgres`, as libpq reaches them with
/// `target_session_attrs=read-write`: one pooled client per host, and every statement sent to
/// the first host, in the configured order, that accepts writes.
///
/// Through a failover (a proxy or a DNS name that moves, or several hosts):
/// - a statement refused because the server is read-only (SQLSTATE 25006, a demoted primary or
///   a standby) did nothing: its connection is closed, so the pool replaces it, the primary is
///   looked for again, and the statement is sent again;
/// - a connection that ends before the answer (the server was killed, restarted, or cut by the
///   proxy) may have committed the statement or not: it is sent again only when it is
///   `repeatable` (a read, or a write whose second run changes nothing and answers the same);
///   otherwise the caller gets `StoreUnavailable`, which the app sees as a 503 with `Retry-After`;
/// - with several hosts, a lost connection also makes the next statement look for the primary.
public final class PostgresServers: Service, Sendable {
    /// One host of `store.postgres.hosts` and its pool.
    struct Server: Sendable {
        let endpoint: String
        let client: PostgresClient
    }

    let servers: [Server]
    let logger: Logger
    /// The server statements go to, and whether it must be looked for before the next one.
    private let state = Mutex(Selection())

    private struct Selection {
        var current = 0
        var stale = false
        /// Bumped at each look-up, so only one of several failing statements starts another.
        var generation = 0
    }

    init(servers: [Server], logger: Logger) {
        precondition(!servers.isEmpty)
        self.servers = servers
        self.logger = logger
        state.withLock { $0.stale = servers.count > 1 }
    }

    /// Pools from Gatehouse's configuration: one per host, each of `pool_size` connections (plus
    /// the one that listens for other instances' revocations).
    public convenience init(_ settings: PostgresSettings, logger: Logger) throws {
        let tls: PostgresClient.Configuration.TLS
        switch settings.tls {
        case .disable:
            tls = .disable
        case .require:
            // Full verification: the certificate chain and the host name.
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            if let caFile = settings.caFile { tlsConfiguration.trustRoots = .file(caFile) }
            tls = .require(tlsConfiguration)
        }
        let servers = settings.hosts.map { endpoint in
            var configuration = PostgresClient.Configuration(
                host: endpoint.host, port: endpoint.port, username: settings.username, password: settings.password?.reveal(),
                database: settings.database, tls: tls)
            configuration.options.maximumConnections = settings.poolSize + 1
            configuration.options.connectionIdleTimeout = .seconds(60)
            // A failover must not wait out the default 10 s on a host that is gone.
            configuration.options.connectTimeout = .seconds(2)
            return Server(endpoint: endpoint.description, client: PostgresClient(configuration: configuration, backgroundLogger: logger))
        }
        self.init(servers: servers, logger: logger)
    }

    /// Runs every host's pool until cancelled.
    public func run() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for server in servers { group.addTask { await server.client.run() } }
            try await group.waitForAll()
        }
    }

    // MARK: Statements

    /// Runs one statement on the primary and reads its rows (see the type's comment for what is
    /// sent again after a failure).
    @discardableResult
    func query(_ query: PostgresQuery, repeatable: Bool, logger: Logger) async throws -> [PostgresRow] {
        // A statement refused as read-only is always sent again; a lost answer only if repeatable.
        var attemptsLeft = 3
        while true {
            if attemptsLeft < 3 {
                // A short pause before the next try: the pool hears of connections that ended.
                try await Task.sleep(for: .milliseconds(attemptsLeft == 2 ? 20 : 200))
            }
            attemptsLeft -= 1
            let index: Int, generation: Int
            do {
                (index, generation) = try await primary()
            } catch let error as StoreUnavailable {
                guard attemptsLeft > 0 else { throw error }
                continue
            }
            do {
                return try await servers[index].client.withConnection { connection in
                    try await Self.send(query, on: connection, logger: logger)
                }
            } catch let error as PSQLError where Self.isReadOnly(error) {
                lookAgain(after: generation)
                logger.warning("the database server is read-only (a standby or a demoted primary); looking for the primary",
                               metadata: ["postgres_host": .string(servers[index].endpoint)])
                guard attemptsLeft > 0 else { throw StoreUnavailable(reason: .readOnly) }
            } catch is ConnectionAlreadyClosed {
                lookAgain(after: generation)
                guard attemptsLeft > 0 else { throw StoreUnavailable(reason: .connectionLost) }
            } catch let error as PSQLError where Self.isConnectionLost(error) {
                lookAgain(after: generation)
                guard repeatable, attemptsLeft > 0 else {
                    throw StoreUnavailable(reason: .connectionLost)
                }
            } catch let error as PSQLError {
                throw error  // the server's answer (a constraint, a syntax error): the caller's to read
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                // The pool could lend no connection (it gave up connecting): nothing was sent.
                lookAgain(after: generation)
                guard attemptsLeft > 0 else { throw StoreUnavailable(reason: .connectionLost) }
            }
        }
    }

    /// Sends `query` on `connection` and reads its rows.
    ///
    /// - A connection the pool lent after it ended (before the pool heard of it) sends nothing:
    ///   `ConnectionAlreadyClosed`.
    /// - Cancelled (a deadline passed), it closes the connection: PostgresNIO's query does not
    ///   end on cancellation, and on a half-open connection (a host gone without a word) it
    ///   would wait for TCP to give up, minutes later.
    /// - A connection that reached a read-only server, or ended, is closed before it goes back,
    ///   so the pool replaces it instead of lending it again.
    static func send(_ query: PostgresQuery, on connection: PostgresConnection, logger: Logger) async throws -> [PostgresRow] {
        guard !connection.isClosed else { throw ConnectionAlreadyClosed() }
        do {
            return try await withTaskCancellationHandler {
                try await connection.query(query, logger: logger).collect()
            } onCancel: {
                let closing: EventLoopFuture<Void> = connection.close()
                closing.whenComplete { _ in }
            }
        } catch let error as PSQLError where isReadOnly(error) || isConnectionLost(error) {
            try? await connection.close()
            throw error
        }
    }

    /// Runs `body` on one connection to the primary (the LISTEN for revocations, the migrations).
    func withConnection<Result: Sendable>(_ body: (PostgresConnection) async throws -> Result) async throws -> Result {
        let (index, generation) = try await primary()
        do {
            return try await servers[index].client.withConnection(body)
        } catch let error as PSQLError where Self.isReadOnly(error) || Self.isConnectionLost(error) {
            lookAgain(after: generation)
            throw error
        }
    }

    // MARK: Finding the primary

    /// The server to send to: the current one, or, after a failure with several hosts, the first
    /// in order that accepts writes (`SELECT pg_is_in_recovery()` false and the session not
    /// read-only), as libpq's `target_session_attrs=read-write` picks. Every server is asked at
    /// once, so a host that is gone costs its deadline only when it comes first and answers nothing.
    private func primary() async throws -> (index: Int, generation: Int) {
        let (current, stale, generation) = state.withLock { ($0.current, $0.stale, $0.generation) }
        guard stale else { return (current, generation) }
        let servers = self.servers, logger = self.logger
        let found = await withTaskGroup(of: (Int, Bool).self) { group -> Int? in
            for (index, server) in servers.enumerated() {
                group.addTask { (index, await Self.acceptsWrites(server, logger: logger)) }
            }
            var answered = Set<Int>(), writable = Set<Int>()
            for await (index, accepts) in group {
                answered.insert(index)
                if accepts { writable.insert(index) }
                // The first writable in order, once every server before it has answered.
                if let best = writable.min(), (0..<best).allSatisfy(answered.contains) {
                    group.cancelAll()
                    return best
                }
            }
            return nil
        }
        guard let index = found else { throw StoreUnavailable(reason: .noPrimary) }
        let (chosen, next) = state.withLock { selection -> (Int, Int) in
            if selection.generation == generation {
                selection.current = index
                selection.stale = false
            }
            return (selection.current, selection.generation)
        }
        if chosen == index, index != current {
            logger.notice("writing to another database server: it accepts writes",
                          metadata: ["postgres_host": .string(servers[index].endpoint)])
        }
        return (chosen, next)
    }

    /// Whether `server` answers, within 1.5 s, that it takes writes.
    private static func acceptsWrites(_ server: Server, logger: Logger) async -> Bool {
        let probe: PostgresQuery = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean"
        do {
            let rows = try await withDeadline(.milliseconds(1500), orThrow: { StoreUnavailable() }) {
                do {
                    return try await server.client.withConnection { try await send(probe, on: $0, logger: logger) }
                } catch is ConnectionAlreadyClosed {
                    // An ended connection says nothing of the server: ask on another.
                    return try await server.client.withConnection { try await send(probe, on: $0, logger: logger) }
                }
            }
            return try rows.first?.decode(Bool.self) == false
        } catch {
            return false
        }
    }

    /// After a failure: with several hosts, the next statement looks for the primary again (with
    /// one host there is nothing to choose, and the pool reconnects by itself). `generation`: the
    /// look-up the failed statement used; a failure from before a later look-up changes nothing.
    /// Without it (a statement that found no answer in time, from `PostgresStore`), it always
    /// counts: the current host may be gone with no connection open to say so, and a pool that
    /// cannot connect makes its statements wait, not fail.
    func lookAgain(after generation: Int? = nil) {
        guard servers.count > 1 else { return }
        state.withLock { selection in
            guard generation == nil || selection.generation == generation else { return }
            selection.generation += 1
            selection.stale = true
        }
    }

    // MARK: Errors

    /// SQLSTATE 25006 `read_only_sql_transaction`: "cannot execute … in a read-only transaction".
    static func isReadOnly(_ error: PSQLError) -> Bool {
        error.code == .server && error.serverInfo?[.sqlState] == "25006"
    }

    /// The connection ended or could not be made: by the network, the proxy, or the server
    /// shutting down, crashing or not yet accepting (SQLSTATE classes 08 and 57P).
    static func isConnectionLost(_ error: PSQLError) -> Bool {
        switch error.code {
        case .serverClosedConnection, .uncleanShutdown, .connectionError, .clientClosedConnection:
            return true
        case .server:
            let state = error.serverInfo?[.sqlState] ?? ""
            return state.hasPrefix("08") || state.hasPrefix("57P")
        default:
            return false
        }
    }
}

/// A connection lent by the pool had already ended: the statement was not sent.
struct ConnectionAlreadyClosed: Error {}

/// The database could not answer: nothing was decided, and the app may try again.
public struct StoreUnavailable: Error, CustomStringConvertible {
    public enum Reason: Sendable {
        case timeout, readOnly, connectionLost, noPrimary
    }

    public var reason: Reason

    public init(reason: Reason = .timeout) {
        self.reason = reason
    }

    public var description: String {
        switch reason {
        case .timeout: "the database did not answer in time"
        case .readOnly: "every database server reached is read-only"
        case .connectionLost: "the connection to the database ended before its answer"
        case .noPrimary: "no database server accepts writes"
        }
    }
}
