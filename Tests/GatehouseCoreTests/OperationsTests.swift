@testable import GatehouseCore
import GatehouseUpstreams
import Synchronization
import Testing

/// `observability`, `rate_limits` and `server.shutdown_*`, and the primitives behind them.
struct OperationsTests {
    typealias C = ConfigurationTests

    static func document(_ extra: [(String, ConfigNode)], server: [(String, ConfigNode)] = []) -> ConfigNode {
        guard case .mapping(let entries, let line) = C.document(server: server) else { return C.document() }
        return .mapping(entries + extra.map { (key: $0.0, value: $0.1) }, line: line)
    }

    static func list(_ items: [String]) -> ConfigNode { .sequence(items.map { C.scalar($0) }, line: 0) }

    @Test func defaultsAreQuiet() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document([]), secrets: C.secrets)
        #expect(configuration.operations == OperationsSettings())
        #expect(configuration.operations.metrics == nil && configuration.operations.tracing == nil)
        #expect(configuration.operations.accessLog == .on)
        #expect(configuration.operations.rateLimits.oauthPerClient == nil)
        #expect(configuration.operations.rateLimits.identityConcurrency == 32)
        #expect(configuration.server.shutdownDrain == .zero && configuration.server.shutdownTimeout == .seconds(25))
    }

    @Test func everySettingDecodes() throws {
        let configuration = try GatehouseConfiguration.decode(Self.document([
            ("observability", C.map([
                ("metrics", C.map([("listen", C.scalar("[::1]:9464")), ("allow", Self.list(["10.0.0.0/8", "127.0.0.1"]))])),
                ("tracing", C.map([("otlp_endpoint", C.scalar("http://127.0.0.1:4318/v1/traces")), ("sample_ratio", C.scalar("0.25"))])),
                ("audit", C.map([("file", C.scalar("/var/lib/gatehouse/audit.log"))])),
                ("access_log", C.scalar("off")),
            ])),
            ("rate_limits", C.map([
                ("trusted_proxies", Self.list(["127.0.0.1", "fd00::/8"])),
                ("oauth_per_client", C.map([("per_second", C.scalar("0.5")), ("burst", C.scalar("3"))])),
                ("identity_concurrency", C.scalar("4")),
            ])),
        ], server: [("shutdown_drain", C.scalar("5s")), ("shutdown_timeout", C.scalar("2m"))]), secrets: C.secrets)
        let operations = configuration.operations
        #expect(operations.metrics?.listenHost == "::1" && operations.metrics?.listenPort == 9464)
        #expect(operations.metrics?.allow.map(\.description) == ["10.0.0.0/8", "127.0.0.1"])
        #expect(operations.tracing == TracingSettings(endpoint: "http://127.0.0.1:4318/v1/traces", sampleRatio: 0.25))
        #expect(operations.auditFile == "/var/lib/gatehouse/audit.log")
        #expect(operations.accessLog == .off)
        #expect(operations.rateLimits.oauthPerClient == BucketSettings(perSecond: 0.5, burst: 3))
        #expect(operations.rateLimits.identityConcurrency == 4)
        #expect(operations.rateLimits.trustedProxies.count == 2)
        #expect(configuration.server.shutdownDrain == .seconds(5) && configuration.server.shutdownTimeout == .seconds(120))
    }

    @Test func badSettingsAreEachNamed() {
        let problems = C.problems(Self.document([
            ("observability", C.map([
                ("metrics", C.map([("listen", C.scalar("9464"))])),
                ("tracing", C.map([("otlp_endpoint", C.scalar("not a url")), ("sample_ratio", C.scalar("2"))])),
                ("logs", C.map([])),
                ("access_log", C.scalar("sometimes")),
            ])),
            ("rate_limits", C.map([
                ("trusted_proxies", Self.list(["10.0.0.0/33", "example.com"])),
                ("oauth_per_client", C.map([("per_second", C.scalar("0"))])),
                ("relay_per_subject", C.map([("per_second", C.scalar("5")), ("burst", C.scalar("0"))])),
                ("identity_concurrency", C.scalar("0")),
            ])),
        ], server: [("shutdown_drain", C.scalar("2h"))]))
        let paths = Set(problems.map { String($0.prefix { $0 != ":" }) })
        #expect(paths == [
            "observability.metrics.listen", "observability.tracing.otlp_endpoint", "observability.tracing.sample_ratio",
            "observability.logs", "observability.access_log", "rate_limits.trusted_proxies[0]", "rate_limits.trusted_proxies[1]",
            "rate_limits.oauth_per_client.per_second", "rate_limits.oauth_per_client.burst",
            "rate_limits.relay_per_subject.burst", "rate_limits.identity_concurrency", "server.shutdown_drain",
        ], "\(problems)")
    }

    @Test func metricsNeedAPlace() {
        let problems = C.problems(Self.document([("observability", C.map([("metrics", C.map([]))]))]))
        #expect(problems.count == 1 && problems[0].hasPrefix("observability.metrics:"))
    }

    @Test func addressRanges() throws {
        let ten = try #require(AddressRange("10.0.0.0/8"))
        #expect(ten.contains("10.200.1.2") && ten.contains("::ffff:10.1.2.3") && !ten.contains("11.0.0.1"))
        #expect(!ten.contains("not an address") && !ten.contains(""))
        let v6 = try #require(AddressRange("fd00::/8"))
        #expect(v6.contains("fd12::1") && v6.contains("[fd00::5]") && !v6.contains("fe80::1") && !v6.contains("10.0.0.1"))
        let one = try #require(AddressRange("127.0.0.1"))
        #expect(one.contains("127.0.0.1") && !one.contains("127.0.0.2"))
        #expect(AddressRange("0.0.0.0/0")?.contains("203.0.113.9") == true)
        for bad in ["10.0.0.0/33", "10.0.0.0/", "10.0.0/8", "::/129", "/8", "10.0.0.0/-1", "example.com"] {
            #expect(AddressRange(bad) == nil, "\(bad)")
        }
    }

    @Test func clientAddressTrustsOnlyConfiguredProxies() throws {
        let trusted = [try #require(AddressRange("127.0.0.1")), try #require(AddressRange("10.0.0.0/8"))]
        // An untrusted peer's header is ignored.
        #expect(ClientAddress.resolve(peer: "198.51.100.7", forwardedFor: "1.2.3.4", forwarded: nil, trusted: trusted) == "198.51.100.7")
        // No trusted proxies: never believed.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "1.2.3.4", forwarded: nil, trusted: []) == "127.0.0.1")
        // The right-most untrusted hop: a client cannot hide behind an address it writes itself.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "6.6.6.6, 203.0.113.5, 10.1.1.1", forwarded: nil,
                                      trusted: trusted) == "203.0.113.5")
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: nil, forwarded: #"for=192.0.2.60;proto=http, for="[2001:db8::1]:4711""#,
                                      trusted: trusted, header: .forwarded) == "2001:db8::1")
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: nil, forwarded: "for=192.0.2.60:8080", trusted: trusted,
                                      header: .forwarded) == "192.0.2.60")
        // Only the configured header: a client's own `Forwarded` passed through by an X-Forwarded-For proxy is never read.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "198.51.100.7", forwarded: "for=203.0.113.1",
                                      trusted: trusted) == "198.51.100.7")
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "198.51.100.7", forwarded: "for=203.0.113.1",
                                      trusted: trusted, header: .forwarded) == "203.0.113.1")
        // Ports some proxies write are not part of the address.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "198.51.100.7:5123", forwarded: nil, trusted: trusted) == "198.51.100.7")
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "[2001:db8::9]:5123", forwarded: nil, trusted: trusted) == "2001:db8::9")
        // Junk in the chain: the peer, never the junk.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "1.2.3.4, <script>", forwarded: nil, trusted: trusted) == "127.0.0.1")
        // Every hop trusted: the first one.
        #expect(ClientAddress.resolve(peer: "127.0.0.1", forwardedFor: "10.0.0.9", forwarded: nil, trusted: trusted) == "10.0.0.9")
    }

    @Test func ipv6AddressesCountByTheirSlash64() {
        #expect(ClientAddress.bucketKey("2001:db8:1:2::1") == "2001:db8:1:2::/64")
        #expect(ClientAddress.bucketKey("2001:db8:1:2:ffff:1:2:3") == ClientAddress.bucketKey("2001:db8:1:2::1"))
        #expect(ClientAddress.bucketKey("2001:db8:1:3::1") != ClientAddress.bucketKey("2001:db8:1:2::1"))
        #expect(ClientAddress.bucketKey("198.51.100.7") == "198.51.100.7")
        #expect(ClientAddress.bucketKey("::ffff:198.51.100.7") == "198.51.100.7", "IPv4-mapped: one address, as IPv4")
        #expect(ClientAddress.bucketKey("junk") == "junk")
    }

    @Test func tokenBucketRefillsAtItsRate() {
        let limiter = TokenBucketLimiter(BucketSettings(perSecond: 2, burst: 3))
        let start = ContinuousClock.now
        for _ in 0..<3 { #expect(limiter.take("a", now: start) == nil) }
        let wait = limiter.take("a", now: start)
        #expect(wait == .milliseconds(500))
        #expect(wait?.retryAfterSeconds == 1)
        #expect(limiter.take("b", now: start) == nil, "another key has its own bucket")
        #expect(limiter.take("a", now: start + .milliseconds(499)) != nil)
        #expect(limiter.take("a", now: start + .milliseconds(1000)) == nil)
        // Idle for long: back to the burst, never above it.
        let later = start + .seconds(3600)
        for _ in 0..<3 { #expect(limiter.take("a", now: later) == nil) }
        #expect(limiter.take("a", now: later) != nil)
    }

    @Test func tokenBucketKeepsItsKeysBounded() {
        let limiter = TokenBucketLimiter(BucketSettings(perSecond: 1, burst: 1), maximumKeys: 100)
        let now = ContinuousClock.now
        for index in 0..<1000 { _ = limiter.take("key\(index)", now: now) }
        #expect(limiter.count <= 100)
    }

    @Test func retryAfterRoundsUp() {
        #expect(Duration.milliseconds(1).retryAfterSeconds == 1)
        #expect(Duration.seconds(2).retryAfterSeconds == 2)
        #expect(Duration.milliseconds(2001).retryAfterSeconds == 3)
        #expect(Duration.zero.retryAfterSeconds == 1)
    }

    @Test func concurrencyLimitCapsAndFailsFastBeyondTheQueue() async throws {
        let limit = ConcurrencyLimit(limit: 2, maximumWaiting: 1)
        let peak = Peak()
        let release = AsyncStream<Void>.makeStream()
        let inside = AsyncStream<Void>.makeStream()
        // Two hold their permits until released.
        async let first: Void = limit.withPermit {
            peak.note(limit.running)
            inside.continuation.yield()
            for await _ in release.stream { break }
        }
        async let second: Void = limit.withPermit {
            peak.note(limit.running)
            inside.continuation.yield()
            for await _ in release.stream { break }
        }
        var entered = 0
        for await _ in inside.stream {
            entered += 1
            if entered == 2 { break }
        }
        // A third waits its turn …
        async let third: Int = limit.withPermit { limit.running }
        while limit.waiting < 1 { await Task.yield() }
        // … and a fourth finds the queue full.
        await #expect(throws: ConcurrencyLimit.Full.self) { try await limit.withPermit { 0 } }
        release.continuation.yield()
        release.continuation.yield()
        release.continuation.finish()
        _ = try await (first, second)
        #expect(try await third <= 2)
        #expect(peak.highest == 2)
        #expect(limit.running == 0 && limit.waiting == 0)
    }

    @Test func subjectHashIsStableAndShort() {
        #expect(AuditLog.subjectHash("alice@example.com") == AuditLog.subjectHash("alice@example.com"))
        #expect(AuditLog.subjectHash("alice@example.com").count == 16)
        #expect(AuditLog.subjectHash("alice@example.com") != AuditLog.subjectHash("bob@example.com"))
        #expect(!AuditLog.subjectHash("alice@example.com").contains("alice"))
    }
}

/// The highest value seen, across tasks.
final class Peak: Sendable {
    private let value = Mutex(0)
    func note(_ current: Int) { value.withLock { $0 = max($0, current) } }
    var highest: Int { value.withLock { $0 } }
}
