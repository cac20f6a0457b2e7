import ArgumentParser
import Foundation
import GatehouseCore
import GatehouseServer
import GatehouseSessions
import GatehouseStore
import Logging

struct Keys: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage the key file that seals upstream tokens (sessions.encryption_keys_file).",
        subcommands: [Generate.self, Rotate.self])

    struct Generate: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print a new key line ('ID BASE64URL'), or write a new key file.")

        @Option(help: "Write a new key file here (refuses to overwrite).")
        var file: String?

        func run() throws {
            let line = KeyRing.newKeyLine()
            guard let file else { return print(line) }
            guard !FileManager.default.fileExists(atPath: file) else { throw ValidationError("\(file) exists; use 'gatehouse keys rotate'") }
            guard FileManager.default.createFile(atPath: file, contents: Data("# Gatehouse session keys: the first seals, all open.\n\(line)\n".utf8),
                                                 attributes: [.posixPermissions: 0o600]) else { throw ValidationError("cannot write \(file)") }
            print("wrote \(file)")
        }
    }

    struct Rotate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Put a new sealing key first in the key file; older keys keep opening what they sealed.",
            discussion: "Running instances pick the new key up at their next start; they then re-seal old sessions in the background.")

        @Option(help: "The key file.")
        var file: String

        func run() throws {
            let current = try String(contentsOfFile: file, encoding: .utf8)
            _ = try KeyRing(parsing: current)
            let line = KeyRing.newKeyLine()
            let lines = current.split(separator: "\n", omittingEmptySubsequences: false)
            let comments = lines.prefix { $0.hasPrefix("#") || $0.isEmpty }
            let rest = lines.dropFirst(comments.count)
            let updated = (comments + [Substring(line)] + rest).joined(separator: "\n")
            try updated.write(toFile: file, atomically: true, encoding: .utf8)
            print("new sealing key \(line.split(separator: " ")[0]) first in \(file)")
        }
    }
}

struct Sessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List or revoke sealed sessions, in the store the configuration names (SQLite or PostgreSQL).",
        subcommands: [List.self, Revoke.self])

    struct List: AsyncParsableCommand {
        @Option(help: "The YAML configuration file.") var config: String
        @Option(help: "Only the sessions of this subject.") var subject: String?

        func run() async throws {
            let (configuration, logger) = try loadForAdmin(config)
            let subject = self.subject
            let sessions = try await OpenedStore.open(configuration, logger: logger).run { store in
                try await store.sessions(subject: subject)
            }
            let formatter = ISO8601DateFormatter()
            print("session\tclient\tupstream\tsubject\tcreated\tstate")
            for session in sessions {
                let state = session.revokedAt != nil ? "revoked" : (session.expiresAt < Date() ? "expired" : "live")
                print("\(session.id.prefix(12))…\t\(session.clientID)\t\(session.upstream)\t\(session.subject ?? "-")\t"
                      + "\(formatter.string(from: session.createdAt))\t\(state)")
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            discussion: """
                Ends the sessions in the store, tells running instances at once (PostgreSQL) and revokes each \
                session's refresh token at the upstream's revocation_endpoint when it has one.
                """)

        @Option(help: "The YAML configuration file.") var config: String
        @Option(help: "Revoke every session of this subject.") var subject: String?
        @Option(help: "Revoke this session (its id, or the first characters 'sessions list' shows).") var session: String?

        func validate() throws {
            guard (subject == nil) != (session == nil) else { throw ValidationError("give --subject or --session") }
        }

        func run() async throws {
            let (configuration, logger) = try loadForAdmin(config)
            try bootstrapAdminAudit(configuration)
            let subject = self.subject
            let wanted = session?.replacingOccurrences(of: "…", with: "")
            let audit = AuditLog()
            let count = try await GatehouseApplication.withUpstreamClients(for: configuration, logger: logger) { upstreams in
                try await OpenedStore.open(configuration, logger: logger).run { store in
                    let chosen = try await store.sessions(subject: subject).filter { record in
                        record.revokedAt == nil && (wanted.map { record.id.hasPrefix($0) } ?? true)
                    }
                    for record in chosen {
                        if let settings = configuration.sessions {
                            try await SessionServices(store: store, settings: settings, logger: logger)
                                .end(record, upstreams: upstreams, identityCache: nil)
                        } else {
                            try await store.revokeSession(id: record.id, now: Date())
                        }
                        audit.record(.admin_revocation, clientID: record.clientID, subject: record.subject, reason: "admin",
                                     metadata: ["upstream": .string(record.upstream)])
                    }
                    return chosen.count
                }
            }
            let heard = configuration.store.postgres != nil
                ? "running instances were told at once" : "the running instance stops honouring their access tokens within 10 s"
            print("revoked \(count) session(s); \(heard)")
        }
    }
}

/// Each revocation is an audit event: to the audit file when one is configured, as `serve` writes them.
func bootstrapAdminAudit(_ configuration: GatehouseConfiguration) throws {
    do {
        try GatehouseLogging.bootstrap(format: .text, level: .warning, auditFile: configuration.operations.auditFile)
    } catch {
        throw ValidationError("the audit log cannot be opened: \(error)")
    }
}

func loadForAdmin(_ config: String) throws -> (GatehouseConfiguration, Logger) {
    let configuration: GatehouseConfiguration
    do {
        configuration = try YAMLConfigurationLoader.load(path: config)
    } catch {
        throw ValidationError("the configuration has problems:\n\(error.description)")
    }
    var logger = Logger(label: "gatehouse")
    logger.logLevel = .warning
    return (configuration, logger)
}
