import Foundation
import GatehouseCore
import GatehouseStore
import Logging
import PostgresNIO

/// The stores every contract test runs against: SQLite always, PostgreSQL when the test
/// script started one (`GATEHOUSE_TEST_POSTGRES=host:port`, as `scripts/test` always does).
enum StoreKind: String, CaseIterable, CustomStringConvertible, Sendable {
    case sqlite, postgres

    var description: String { rawValue }

    static var available: [StoreKind] {
        ProcessInfo.processInfo.environment["GATEHOUSE_TEST_POSTGRES"] == nil ? [.sqlite] : [.sqlite, .postgres]
    }
}

typealias ContractStore = any GatehouseStore

/// Runs `body` against a fresh, empty store of `kind` (a new SQLite file, or a new PostgreSQL database).
func withStore(_ kind: StoreKind, _ body: @Sendable (ContractStore) async throws -> Void) async throws {
    var logger = Logger(label: "test")
    logger.logLevel = .error
    switch kind {
    case .sqlite:
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-\(UUID().uuidString).sqlite")
        defer { try? FileManager.default.removeItem(at: url) }
        let store = try await SQLiteAuthorizationStore.open(path: url.path, logger: logger)
        do { try await body(store) } catch { try? await store.close(); throw error }
        try await store.close()
    case .postgres:
        let address = ProcessInfo.processInfo.environment["GATEHOUSE_TEST_POSTGRES"] ?? ""
        let parts = address.split(separator: ":")
        let host = String(parts.first ?? "127.0.0.1"), port = Int(parts.last ?? "5432") ?? 5432
        func client(_ database: String) -> PostgresClient {
            PostgresClient(configuration: .init(host: host, port: port, username: "gatehouse", password: nil, database: database, tls: .disable),
                           backgroundLogger: logger)
        }
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        let admin = client("gatehouse")
        let databaseClient = client(name)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await admin.run() }
            group.addTask { await databaseClient.run() }
            try await admin.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"))
            let store = PostgresStore(client: databaseClient, logger: logger)
            try await store.migrate()
            try await store.migrate()  // idempotent: a second instance starting finds nothing to do
            try await body(store)
            group.cancelAll()
        }
    }
}
