import ArgumentParser
#if canImport(Glibc)
import Glibc
#endif
import Foundation
import GatehouseCore
import GatehouseServer
import Logging
import NIOCore
import NIOPosix

@main
struct GatehouseCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gatehouse",
        abstract: "A backend-for-frontend OAuth gateway for native mobile apps.",
        version: "0.1.0",
        subcommands: [Serve.self, CheckConfig.self, Keys.self, Sessions.self, Instances.self, BenchIdentityCache.self])
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the gateway.")

    @Option(name: .long, help: "The YAML configuration file.")
    var config: String

    @Option(name: .long, help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String = ProcessInfo.processInfo.environment["LOG_LEVEL"] ?? "info"

    @Option(name: .long, help: "text, or json (one object a line).")
    var logFormat: String = ProcessInfo.processInfo.environment["LOG_FORMAT"] ?? "text"

    func run() async throws {
        guard let level = Logger.Level(rawValue: logLevel) else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        guard let format = LogFormat(rawValue: logFormat) else {
            throw ValidationError("--log-format must be text or json")
        }
        // A reload (SIGHUP) is heard once the server runs; one that comes sooner must not end the process.
        signal(SIGHUP, SIG_IGN)
        let configuration: GatehouseConfiguration
        let source: ConfigurationSource
        do {
            (configuration, source) = try YAMLConfigurationLoader.loadSource(path: config)
        } catch {
            FileHandle.standardError.write(Data("gatehouse: the configuration has problems:\n\(error.description)\n".utf8))
            throw ExitCode(78)  // EX_CONFIG
        }
        let accessLog: AccessLog
        do {
            accessLog = try GatehouseLogging.bootstrap(format: format, level: level, auditFile: configuration.operations.auditFile)
        } catch {
            FileHandle.standardError.write(Data("gatehouse: \(error)\n".utf8))
            throw ExitCode(73)  // EX_CANTCREAT
        }
        // Swift concurrency runs on NIO's event loops: no thread hop between the server's
        // channel, the route's task and the outbound client.
        _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        let logger = Logger(label: "gatehouse")
        try await GatehouseApplication.run(configuration: configuration, source: source, configurationPath: config, logger: logger,
                                           accessLog: accessLog)
    }
}

struct CheckConfig: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Validate a configuration file and list every problem with its YAML path.")

    @Argument(help: "The YAML configuration file.")
    var file: String

    func run() throws {
        do {
            let configuration = try YAMLConfigurationLoader.load(path: file)
            print("\(file): OK (\(configuration.upstreams.count) upstream(s), \(configuration.clients.count) client(s))")
        } catch {
            print("\(file): \(error.problems.count) problem(s)")
            for problem in error.problems { print("  \(problem)") }
            throw ExitCode(78)
        }
    }
}
