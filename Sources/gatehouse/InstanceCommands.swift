import ArgumentParser
import Foundation
import GatehouseCore
import GatehouseServer
import GatehouseSessions
import Logging

struct Instances: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List or revoke registered app instances, in the store the configuration names (SQLite or PostgreSQL).",
        subcommands: [List.self, Revoke.self])

    struct List: AsyncParsableCommand {
        @Option(help: "The YAML configuration file.") var config: String
        @Option(help: "Only the instances of this app (its client_id).") var client: String?
        @Flag(help: "One JSON object per line instead of a table.") var json = false

        func run() async throws {
            let (configuration, logger) = try loadForAdmin(config)
            let client = self.client
            let instances = try await OpenedStore.open(configuration, logger: logger).run { store in
                try await store.instances(softwareID: client)
            }
            let formatter = ISO8601DateFormatter()
            let now = Date()
            func state(_ instance: InstanceRecord) -> String {
                instance.revokedAt != nil ? "revoked" : (instance.expiresAt <= now ? "expired" : "live")
            }
            if json {
                for instance in instances {
                    let line: [String: String] = [
                        "client_id": instance.id, "app": instance.softwareID, "state": state(instance),
                        "certification": instance.certification?.rawValue ?? "none", "dpop_bound": instance.dpopJKT == nil ? "false" : "true",
                        "created": formatter.string(from: instance.createdAt), "last_used": formatter.string(from: instance.lastUsedAt),
                        "expires": formatter.string(from: instance.expiresAt),
                    ]
                    let data = try JSONSerialization.data(withJSONObject: line, options: [.sortedKeys])
                    print(String(decoding: data, as: UTF8.self))
                }
                return
            }
            print("instance\tapp\tcertification\tdpop\tlast used\tstate")
            for instance in instances {
                print("\(instance.id)\t\(instance.softwareID)\t\(instance.certification?.rawValue ?? "none")\t"
                      + "\(instance.dpopJKT == nil ? "-" : "bound")\t\(formatter.string(from: instance.lastUsedAt))\t\(state(instance))")
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            discussion: """
                Revokes the instance (its client_id stops working) and ends every session it opened, \
                as 'sessions revoke' does (running instances are told at once on PostgreSQL).
                """)

        @Option(help: "The YAML configuration file.") var config: String
        @Argument(help: "The instance's client_id, as 'instances list' shows it.") var instance: String

        func run() async throws {
            let (configuration, logger) = try loadForAdmin(config)
            try bootstrapAdminAudit(configuration)
            let id = instance
            let audit = AuditLog()
            let (revoked, ended) = try await GatehouseApplication.withUpstreamClients(for: configuration, logger: logger) { upstreams in
                try await OpenedStore.open(configuration, logger: logger).run { store in
                    guard let record = try await store.instance(id: id) else { return (false, -1) }
                    let revoked = try await store.revokeInstance(id: id, now: Date())
                    var ended = 0
                    for session in try await store.sessions(clientID: id) where session.revokedAt == nil {
                        if let settings = configuration.sessions {
                            try await SessionServices(store: store, settings: settings, logger: logger)
                                .end(session, upstreams: upstreams, identityCache: nil)
                        } else {
                            try await store.revokeSession(id: session.id, now: Date())
                        }
                        ended += 1
                    }
                    audit.record(.instance_revoked, clientID: record.id, subject: nil, reason: "admin",
                                 metadata: ["sessions_ended": .stringConvertible(ended)])
                    return (revoked, ended)
                }
            }
            guard ended >= 0 else { throw ValidationError("no instance has the client_id \(id)") }
            print(revoked ? "revoked the instance and ended \(ended) session(s)" : "the instance was already revoked; ended \(ended) session(s)")
        }
    }
}
