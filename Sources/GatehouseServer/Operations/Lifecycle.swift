import AsyncHTTPClient
import GatehouseCore
import GatehouseRelay
public import Logging
import ServiceLifecycle
import Synchronization
import UnixSignals

/// The process's signals, with swift-service-lifecycle:
///
/// - SIGTERM or SIGINT: `/readyz` answers 503 at once while requests are still served for
///   `server.shutdown_drain` (load balancers take the instance out), then the listener closes
///   and in-flight requests, fast path included, have `server.shutdown_timeout` to finish; then
///   the process exits 0.
/// - SIGHUP: the configuration file is read again (`Reloader`); connections stay open.
struct Lifecycle: Sendable {
    let readiness: Readiness
    let drain: Duration
    let logger: Logger
    let reload: @Sendable () async -> Void

    /// Runs `app` beside `services` (metrics listener, trace exporter) until a signal stops it.
    func run(_ app: some Service, beside services: [any Service], timeout: Duration) async throws {
        var configurations = services.map { ServiceGroupConfiguration.ServiceConfiguration(service: $0) }
        // Shut down in reverse order: the supervisor (already returned), the server, then the exporters (they flush last).
        configurations.append(.init(service: app, successTerminationBehavior: .gracefullyShutdownGroup))
        configurations.append(.init(service: SignalSupervisor(readiness: readiness, drain: drain, logger: logger, reload: reload),
                                    successTerminationBehavior: .gracefullyShutdownGroup))
        var configuration = ServiceGroupConfiguration(services: configurations, gracefulShutdownSignals: [], cancellationSignals: [],
                                                      logger: logger)
        configuration.maximumGracefulShutdownDuration = timeout
        configuration.maximumCancellationDuration = .seconds(5)
        do {
            try await ServiceGroup(configuration: configuration).run()
        } catch where readiness.isDraining {
            // The shutdown was asked for; the deadline cut what was still running.
            logger.warning("shutdown_timeout passed: connections still open were closed", metadata: [
                "error_type": .string(String(describing: type(of: error))),
            ])
        }
        logger.notice("gatehouse stopped")
    }
}

/// Waits for SIGTERM, SIGINT and SIGHUP. Returning starts the group's graceful shutdown.
struct SignalSupervisor: Service {
    let readiness: Readiness
    let drain: Duration
    let logger: Logger
    let reload: @Sendable () async -> Void

    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint, .sighup)
        for await signal in signals.cancelOnGracefulShutdown() {
            if signal == .sighup {
                await reload()
                continue
            }
            readiness.startDraining()
            logger.notice("shutting down: /readyz now answers 503; requests are still served during the drain", metadata: [
                "signal": .string(String(describing: signal)), "drain_ms": .stringConvertible(drain.inNanoseconds / 1_000_000),
            ])
            // The drain itself: load balancers need this long to stop sending to this instance.
            try await Task.sleep(for: drain)
            logger.notice("drain over: the listener closes; in-flight requests finish")
            return
        }
    }
}

/// SIGHUP: reads the configuration file again. A file with problems, or one that changes more
/// than `clients`, `routes` and `rate_limits`, is refused with its reasons logged, and the
/// configuration in force is kept. Otherwise new requests see the new configuration; requests
/// running finish with the one they started with; no connection is dropped.
final class Reloader: Sendable {
    /// The top-level sections a reload may change.
    static let reloadable: Set<String> = ["clients", "routes", "rate_limits"]

    private let holder: GatehouseHolder
    private let planner: ReloadablePlanner
    private let httpClient: HTTPClient
    private let cache: IdentityCache
    private let logger: Logger
    private let state: Mutex<State>

    struct State {
        var source: ConfigurationSource?
        /// Backend clients made by reloads that added the first routes (shut down at exit).
        var backendClients: [HTTPClient] = []
    }

    init(holder: GatehouseHolder, planner: ReloadablePlanner, httpClient: HTTPClient, cache: IdentityCache,
         source: ConfigurationSource?, logger: Logger) {
        self.holder = holder
        self.planner = planner
        self.httpClient = httpClient
        self.cache = cache
        self.logger = logger
        self.state = Mutex(State(source: source))
    }

    func backendClients(first: HTTPClient?) -> [HTTPClient] {
        (first.map { [$0] } ?? []) + state.withLock { $0.backendClients }
    }

    func reload(from path: String) async {
        let configuration: GatehouseConfiguration
        let source: ConfigurationSource
        do {
            (configuration, source) = try YAMLConfigurationLoader.loadSource(path: path)
        } catch {
            logger.error("configuration reload refused: the file has problems; the configuration in force is kept", metadata: [
                "problems": .array(error.problems.map { .string($0.description) }),
            ])
            return
        }
        let previous = state.withLock { $0.source }
        let changed = Self.sectionsNeedingRestart(from: previous?.document, to: source.document)
        guard changed.isEmpty else {
            logger.error("configuration reload refused: \(changed.joined(separator: ", ")) changed; restart to apply. The configuration in force is kept")
            return
        }
        // Secrets and keys are read at start: a file whose content changed is applied by a restart only.
        let changedFiles = Self.changedFiles(from: previous?.fileDigests ?? [:], to: source.fileDigests)
        guard changedFiles.isEmpty else {
            logger.error("configuration reload refused: a file the configuration reads changed (\(changedFiles.joined(separator: ", "))); restart to apply. The configuration in force is kept")
            return
        }
        let old = holder.current
        let needsSigner = configuration.routes.contains { $0.authorization == .assertion }
        if needsSigner, old.signer == nil {
            logger.error("configuration reload refused: a route with authorization: assertion needs the signing key, which is made at start; restart to apply")
            return
        }
        // The backend client of the routes in force, else one an earlier reload made (never one per reload).
        var backendClient = old.relay?.backendClient ?? state.withLock { $0.backendClients.last }
        if backendClient == nil, !configuration.routes.isEmpty {
            let client = RelayServices.makeBackendClient(for: configuration)
            state.withLock { $0.backendClients.append(client) }
            backendClient = client
        }
        // Upstreams never change in a reload: their identity resolvers (JWKS caches, concurrency caps)
        // are kept, unless `identity_concurrency` changed.
        let keepResolvers = old.configuration.operations.rateLimits.identityConcurrency == configuration.operations.rateLimits.identityConcurrency
        let relay = GatehouseApplication.makeRelayServices(for: configuration, httpClient: httpClient, cache: cache,
                                                           signer: old.signer, backendClient: backendClient,
                                                           resolvers: keepResolvers ? old.relay?.resolvers : nil)
        let gatehouse = Gatehouse(configuration: configuration, store: old.store, upstreams: old.upstreams, relay: relay,
                                  sessions: old.sessions, signer: old.signer, now: old.now, logger: old.logger,
                                  audit: old.audit, previous: old)
        holder.replace(with: gatehouse)
        planner.replace(with: GatehouseApplication.fastRelayPlanner(for: gatehouse))
        state.withLock { $0.source = source }
        logger.notice("configuration reloaded", metadata: [
            "clients": .stringConvertible(configuration.clients.count), "routes": .stringConvertible(configuration.routes.count),
        ])
    }

    /// Files read by both configurations whose content differs. A file only the new one reads
    /// (the key files of a client the reload adds) is read now, so the new configuration holds
    /// what it says; a file only the old one read is no longer used.
    static func changedFiles(from old: [String: String], to new: [String: String]) -> [String] {
        Set(old.keys).intersection(new.keys).sorted().filter { old[$0] != new[$0] }
    }

    /// Top-level sections other than the reloadable ones whose content differs.
    static func sectionsNeedingRestart(from old: ConfigNode?, to new: ConfigNode) -> [String] {
        let before = sections(of: old)
        let after = sections(of: new)
        return Set(before.keys).union(after.keys).subtracting(reloadable).sorted().filter { before[$0] != after[$0] }
    }

    private static func sections(of node: ConfigNode?) -> [String: ConfigNode] {
        guard case .mapping(let entries, _) = node else { return [:] }
        return Dictionary(entries.map { ($0.key, $0.value) }) { first, _ in first }
    }
}
