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
    private let logger: Logger
    /// The source of the configuration in force (its document and the digests of the files it read).
    private let source: Mutex<ConfigurationSource?>

    init(holder: GatehouseHolder, source: ConfigurationSource?, logger: Logger) {
        self.holder = holder
        self.logger = logger
        self.source = Mutex(source)
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
        let previous = self.source.withLock { $0 }
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
        // Everything that outlives a configuration is the runtime's: the new Gatehouse is built on
        // the one in force, and put in force with its fast-path planner in one step.
        let runtime = holder.current.runtime
        let needsSigner = configuration.routes.contains { $0.authorization == .assertion }
        if needsSigner, runtime.signer == nil {
            logger.error("configuration reload refused: a route with authorization: assertion needs the signing key, which is made at start; restart to apply")
            return
        }
        holder.replace(with: Gatehouse(configuration: configuration, runtime: runtime))
        self.source.withLock { $0 = source }
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
