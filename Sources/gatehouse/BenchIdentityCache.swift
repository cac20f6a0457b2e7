import ArgumentParser
import Foundation
import GatehouseCore
import GatehouseRelay

/// Fills an identity cache with synthetic identities and reports the memory it takes,
/// for `Benchmarks/run` (the target: 1,000,000 identities in at most 300 MiB).
struct BenchIdentityCache: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-identity-cache",
        abstract: "Measure the resident memory of the identity cache holding N identities.")

    @Option(help: "How many identities to cache.")
    var entries: Int = 1_000_000

    func run() throws {
        let before = Self.residentKiB()
        let cache = IdentityCache(maximumEntries: entries)
        let started = ContinuousClock.now
        // As the identity resolvers build them: one shared array of attribute names.
        let names = AttributeNames(["bpid_status"])
        for index in 0..<entries {
            let identity = CallerIdentity(
                subject: "user\(index)@example.test", bpid: String(1_000_000 + index), scopeText: "read write",
                attributeNames: names, attributeValues: ["active"], expiresAt: nil)
            cache.insert(.active(identity), forToken: "token-\(index)", upstream: "legacy", ttl: .seconds(3600))
        }
        let elapsed = ContinuousClock.now - started
        let after = Self.residentKiB()
        let grownMiB = Double(after - before) / 1024
        print("entries: \(cache.count)")
        print(String(format: "RSS before: %.1f MiB, after: %.1f MiB, cache: %.1f MiB (%.0f bytes per entry)",
                     Double(before) / 1024, Double(after) / 1024, grownMiB, Double(after - before) * 1024 / Double(entries)))
        print(String(format: "fill time: %.2f s", Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))
    }

    static func residentKiB() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
        return line.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
    }
}
