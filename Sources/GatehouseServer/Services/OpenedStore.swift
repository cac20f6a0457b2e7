public import GatehouseCore
import GatehouseStore
public import Logging
import ServiceLifecycle

/// The store a configuration names (`store.sqlite_path` or `store.postgres`), opened one way
/// for `gatehouse serve` and for every admin command, so an admin command can never open
/// another database than the gateway it administers.
public struct OpenedStore: Sendable {
    public let store: any GatehouseStore
    /// Set on PostgreSQL: its pools run as a service, and other instances' revocations are heard.
    let postgres: PostgresStore?
    let sqlite: SQLiteAuthorizationStore?

    public static func open(_ configuration: GatehouseConfiguration, logger: Logger) async throws -> OpenedStore {
        if let settings = configuration.store.postgres {
            let postgres = PostgresStore(database: try PostgresServers(settings, logger: logger), poolSize: settings.poolSize, logger: logger)
            return OpenedStore(store: postgres, postgres: postgres, sqlite: nil)
        }
        let sqlite = try await SQLiteAuthorizationStore.open(path: configuration.store.sqlitePath, logger: logger)
        return OpenedStore(store: sqlite, postgres: nil, sqlite: sqlite)
    }

    /// What must run beside the server (PostgreSQL's connection pool).
    var services: [any Service] { postgres.map { [$0.database] } ?? [] }

    /// Brings the schema up to date (PostgreSQL: once its pool runs; SQLite did at `open`).
    func prepare() async throws {
        try await postgres?.migrate()
    }

    func close() async {
        try? await sqlite?.close()
    }

    /// Runs `body` with the store ready, then closes it: for commands that are not a server.
    public func run<Result: Sendable>(_ body: @Sendable (any GatehouseStore) async throws -> Result) async throws -> Result {
        guard let postgres else {
            do {
                let result = try await body(store)
                await close()
                return result
            } catch {
                await close()
                throw error
            }
        }
        return try await withThrowingTaskGroup(of: Void.self) { group in
            let pool: any Service = postgres.database
            group.addTask { try await pool.run() }
            defer { group.cancelAll() }
            try await postgres.migrate()
            return try await body(postgres)
        }
    }
}
