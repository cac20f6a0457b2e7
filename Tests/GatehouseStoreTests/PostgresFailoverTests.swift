import Foundation
import GatehouseCore
@testable import GatehouseStore
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization
import Testing

/// What a failover does to a connection, done to a real PostgreSQL (`GATEHOUSE_TEST_POSTGRES`):
/// a server that is read-only (as a standby or a demoted primary is), a connection cut in the
/// middle of a statement, a revocation channel cut while another instance announces.
@Suite(.enabled(if: StoreKind.available.contains(.postgres)))
struct PostgresFailoverTests {
    static let logger: Logger = {
        var logger = Logger(label: "test")
        logger.logLevel = .error
        return logger
    }()

    static func client(_ database: String, connections: Int = 4) -> PostgresClient {
        let address = ProcessInfo.processInfo.environment["GATEHOUSE_TEST_POSTGRES"] ?? ""
        let parts = address.split(separator: ":")
        var configuration = PostgresClient.Configuration(host: String(parts.first ?? "127.0.0.1"), port: Int(parts.last ?? "5432") ?? 5432,
                                                         username: "gatehouse", password: nil, database: database, tls: .disable)
        configuration.options.maximumConnections = connections
        return PostgresClient(configuration: configuration, backgroundLogger: logger)
    }

    /// Runs `body` with an admin client and `count` new databases, each with a table `t (v TEXT)`.
    static func withDatabases(_ count: Int, _ body: @Sendable (PostgresClient, [String]) async throws -> Void) async throws {
        let admin = client("gatehouse")
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await admin.run() }
            var names: [String] = []
            for _ in 0..<count {
                let name = "f_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
                try await admin.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"))
                let setup = client(name)
                group.addTask { await setup.run() }
                try await setup.query("CREATE TABLE t (v TEXT)")
                names.append(name)
            }
            try await body(admin, names)
            group.cancelAll()
        }
    }

    static func rows(_ client: PostgresClient) async throws -> [String] {
        var values: [String] = []
        for try await value in try await client.query("SELECT v FROM t ORDER BY v").decode(String.self) { values.append(value) }
        return values
    }

    /// Read through `database` (sent again if the cut connection is lent once more).
    static func rows(_ database: PostgresServers) async throws -> [String] {
        try await database.query("SELECT v FROM t ORDER BY v", repeatable: true, logger: logger).map { try $0.decode(String.self) }
    }

    @Test func writesGoToTheFirstServerThatAcceptsThem() async throws {
        try await Self.withDatabases(2) { admin, names in
            // The first server answers like a standby: every session it opens is read-only.
            try await admin.query(PostgresQuery(unsafeSQL: "ALTER DATABASE \(names[0]) SET default_transaction_read_only = on"))
            let standby = Self.client(names[0]), primary = Self.client(names[1])
            let database = PostgresServers(servers: [.init(endpoint: "standby", client: standby), .init(endpoint: "primary", client: primary)],
                                            logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await database.run() }
                try await database.query("INSERT INTO t VALUES ('written')", repeatable: false, logger: Self.logger)
                #expect(try await Self.rows(primary) == ["written"])
                #expect(try await Self.rows(standby) == [])
                group.cancelAll()
            }
        }
    }

    @Test func aServerThatCannotBeReachedIsPassedOver() async throws {
        try await Self.withDatabases(1) { _, names in
            // Nothing listens there: the port of a socket bound and closed.
            let port = try Self.closedPort()
            var configuration = PostgresClient.Configuration(host: "127.0.0.1", port: port, username: "gatehouse", password: nil,
                                                             database: names[0], tls: .disable)
            configuration.options.connectTimeout = .milliseconds(200)
            let gone = PostgresClient(configuration: configuration, backgroundLogger: Self.logger)
            let primary = Self.client(names[0])
            let database = PostgresServers(servers: [.init(endpoint: "gone", client: gone), .init(endpoint: "primary", client: primary)],
                                           logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await database.run() }
                try await database.query("INSERT INTO t VALUES ('written')", repeatable: false, logger: Self.logger)
                #expect(try await Self.rows(primary) == ["written"])
                group.cancelAll()
            }
        }
    }

    static func closedPort() throws -> Int {
        let socket = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).wait()
        let port = socket.localAddress?.port ?? 1
        try socket.close().wait()
        return port
    }

    @Test func aConnectionFoundReadOnlyIsClosedAndTheStatementSentWhereWritesGo() async throws {
        try await Self.withDatabases(2) { admin, names in
            let first = Self.client(names[0], connections: 1), second = Self.client(names[1])
            let database = PostgresServers(servers: [.init(endpoint: "first", client: first), .init(endpoint: "second", client: second)],
                                            logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await database.run() }
                try await database.query("INSERT INTO t VALUES ('before')", repeatable: false, logger: Self.logger)
                #expect(try await Self.rows(first) == ["before"])
                let before = try await database.query("SELECT pg_backend_pid()", repeatable: true, logger: Self.logger)
                    .first?.decode(Int32.self)
                // The first server is demoted: its open connection and every new one are read-only.
                try await admin.query(PostgresQuery(unsafeSQL: "ALTER DATABASE \(names[0]) SET default_transaction_read_only = on"))
                try await database.query("SET default_transaction_read_only = on", repeatable: true, logger: Self.logger)
                // Not repeatable, yet sent again: a statement refused as read-only did nothing.
                try await database.query("INSERT INTO t VALUES ('after')", repeatable: false, logger: Self.logger)
                #expect(try await Self.rows(second) == ["after"])
                #expect(try await Self.rows(first) == ["before"])
                // The read-only connection was closed, not kept in the pool.
                let pids = try await admin.query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = \(names[0]) AND pid <> pg_backend_pid()").decode(Int32.self)
                var open: [Int32] = []
                for try await pid in pids { open.append(pid) }
                #expect(before != nil && !open.contains(before!))
                group.cancelAll()
            }
        }
    }

    @Test(arguments: [true, false])
    func aStatementCutMidwayIsSentAgainOnlyWhenRepeatable(repeatable: Bool) async throws {
        try await Self.withDatabases(1) { admin, names in
            let server = Self.client(names[0])
            let database = PostgresServers(servers: [.init(endpoint: "only", client: server)], logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await database.run() }
                let marker = "cut-" + UUID().uuidString.prefix(8).lowercased()
                // Cuts the statement's connection once, while it runs (as a failover cuts it).
                group.addTask {
                    while true {
                        let rows = try await admin.query(PostgresQuery(unsafeSQL: """
                            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                            WHERE query LIKE '%\(marker)%' AND pid <> pg_backend_pid() AND state = 'active'
                            """)).collect()
                        if !rows.isEmpty { return }
                        try await Task.sleep(for: .milliseconds(20))
                    }
                }
                let statement = PostgresQuery(unsafeSQL: "INSERT INTO t SELECT '\(marker)' FROM pg_sleep(0.5)")
                var failure: StoreUnavailable?
                do {
                    try await database.query(statement, repeatable: repeatable, logger: Self.logger)
                } catch let error as StoreUnavailable {
                    failure = error
                }
                if repeatable {
                    #expect(failure == nil)
                    #expect(try await Self.rows(database) == [marker])
                } else {
                    // A statement that may have committed is never sent twice: the caller answers 503.
                    #expect(failure?.reason == .connectionLost)
                    #expect(try await Self.rows(database) == [])
                }
                group.cancelAll()
            }
        }
    }

    @Test(arguments: [true, false])
    func aStatementPastItsDeadlineEndsAtTheDeadline(repeatable: Bool) async throws {
        try await Self.withDatabases(1) { _, names in
            let client = Self.client(names[0])
            let store = PostgresStore(client: client, logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { await client.run() }
                let clock = ContinuousClock()
                let started = clock.now
                // As a statement on a connection whose host went silent: no answer comes.
                await #expect(throws: StoreUnavailable.self) {
                    try await store.query("SELECT pg_sleep(30)", repeatable: repeatable, logger: Self.logger)
                }
                // PostgresNIO's query does not end when cancelled: unless its connection is closed,
                // the deadline's answer waits for the statement, here the whole 30 s.
                #expect(clock.now - started < .seconds(15))
                // The pool lends a working connection afterwards.
                let after = try await store.query("SELECT 1", repeatable: true, logger: Self.logger)
                #expect(after.count == 1)
                group.cancelAll()
            }
        }
    }

    @Test func aRevocationAnnouncedWhileTheChannelIsDownArrivesWhenItIsBack() async throws {
        try await Self.withDatabases(1) { admin, names in
            let listenerClient = Self.client(names[0]), announcerClient = Self.client(names[0])
            let listener = PostgresStore(client: listenerClient, logger: Self.logger)
            let announcer = PostgresStore(client: announcerClient, logger: Self.logger)
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { await listenerClient.run() }
                group.addTask { await announcerClient.run() }
                try await listener.migrate()
                // Announced after this instance started, before it first listened (it may have cached the token by then).
                try await announcer.announceRevocation("session early")
                let heard = Heard()
                let listening = AsyncStream<Void>.makeStream()
                // The first subscription: heard, then cut by the server (every connection to the database) as a failover cuts it.
                let first = Task {
                    try await listener.listenForRevocations(onListening: { listening.continuation.yield() }) { message in
                        heard.messages.withLock { $0.append(message) }
                    }
                }
                var ready = listening.stream.makeAsyncIterator()
                await ready.next()
                #expect(heard.messages.withLock { $0 } == ["session early"])
                try await announcer.announceRevocation("session before")
                try await admin.query(PostgresQuery(unsafeSQL: """
                    SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(names[0])' AND pid <> pg_backend_pid()
                    """))
                await #expect(throws: (any Error).self) { try await first.value }
                // Announced while nobody listens: only the table has it.
                try await announcer.announceRevocation("session during")
                let second = Task {
                    try await listener.listenForRevocations(onListening: { listening.continuation.yield() }) { message in
                        heard.messages.withLock { $0.append(message) }
                    }
                }
                await ready.next()
                // Read from the table before the subscription counts as up.
                #expect(heard.messages.withLock { $0 }.contains("session during"))
                second.cancel()
                group.cancelAll()
            }
        }
    }
}

/// What a listener heard, from the tasks that listen.
final class Heard: Sendable {
    let messages = Mutex<[String]>([])
}
