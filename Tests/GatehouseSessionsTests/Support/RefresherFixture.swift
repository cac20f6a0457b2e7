import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseStore
import Logging
import Synchronization

/// A clock that runs with real time and that the test can move ahead (the refresher's waits
/// are bounded by it, so it must keep running; the grace window is crossed by `advance`).
final class OffsetClock: Sendable {
    private let offset = Mutex<TimeInterval>(0)
    func now() -> Date { Date().addingTimeInterval(offset.withLock { $0 }) }
    func advance(seconds: TimeInterval) { offset.withLock { $0 += seconds } }
}

/// A passthrough refresher on a real store (SQLite, in memory), before a scripted upstream.
struct RefresherFixture {
    static let app = try! AppClient(clientID: "com.example.app", upstream: "legacy", tokenExposure: .passthrough,
                                    redirectURIs: [RedirectURI(registering: "com.example.app:/cb")], scopes: ["read"])
    static let otherApp = try! AppClient(clientID: "com.example.other", upstream: "legacy", tokenExposure: .passthrough,
                                         redirectURIs: [RedirectURI(registering: "com.example.other:/cb")], scopes: ["read"])
    /// What the upstream handed the app at sign-in: Gatehouse bound both tokens to it.
    static let signIn = Data(#"{"access_token":"upstream-at","token_type":"Bearer","expires_in":3600,"refresh_token":"upstream-rt"}"#.utf8)

    let store: SQLiteAuthorizationStore
    let upstream: ScriptedUpstream
    let clock = OffsetClock()
    let audit = RecordedLog()
    let grace: Duration

    /// A refresher of this Gatehouse instance; call it again for another instance on the same store.
    func refresher(store: (any PassthroughTokenStore)? = nil) -> PassthroughRefresher {
        let configuration = GatehouseConfiguration(
            server: ServerSettings(publicBaseURL: "https://gatehouse.example.com"), store: StoreSettings(sqlitePath: ":memory:"),
            upstreams: ["legacy": upstream.settings], clients: [Self.app.clientID: Self.app, Self.otherApp.clientID: Self.otherApp],
            sessions: SessionSettings(keyRing: try! KeyRing(parsing: "k1 " + SecureToken.generate()), refreshGrace: grace))
        return PassthroughRefresher(store: store ?? self.store, configuration: configuration, now: { [clock] in clock.now() },
                                    logger: Self.quiet, audit: AuditLog(logger: audit.logger))
    }

    static var quiet: Logger {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        return logger
    }

    /// Runs `body` with a fresh store and upstream (`bound`: the sign-in's tokens bound to `app`), then closes the store.
    static func with(_ upstream: ScriptedUpstream = ScriptedUpstream(), grace: Duration = .seconds(30), bound: Bool = true,
                     _ body: (RefresherFixture, PassthroughRefresher) async throws -> Void) async throws {
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: quiet)
        let fixture = RefresherFixture(store: store, upstream: upstream, grace: grace)
        let refresher = fixture.refresher()
        do {
            if bound { await refresher.bind(signIn, to: app) }
            try await body(fixture, refresher)
        } catch {
            try await store.close()
            throw error
        }
        try await store.close()
    }
}

/// A store that cannot be reached: every call fails.
struct UnreachableStore: PassthroughTokenStore {
    struct Down: Error {}
    func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws { throw Down() }
    func passthroughToken(hash: String) async throws -> PassthroughTokenRecord? { throw Down() }
    func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                   answeredBefore: Date, expiresAt: Date) async throws -> Bool { throw Down() }
    func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool { throw Down() }
    func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws { throw Down() }
}

/// The real store, every call named in `calls` in the order made (each is one statement on SQLite
/// and PostgreSQL). `reads`, when given, arrives at each read of a token's record (with or without
/// its lease): a test of two instances knows when one has found the other's lease.
final class CountingStore: PassthroughTokenStore {
    let base: any PassthroughTokenStore
    let reads: Arrivals?
    private let made = Mutex<[String]>([])
    var calls: [String] { made.withLock { $0 } }

    init(base: any PassthroughTokenStore, reads: Arrivals? = nil) {
        self.base = base
        self.reads = reads
    }

    private func note(_ call: String) { made.withLock { $0.append(call) } }

    func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws {
        note("bind")
        try await base.bindPassthroughTokens(tokens, clientID: clientID, upstream: upstream)
    }

    func passthroughToken(hash: String) async throws -> PassthroughTokenRecord? {
        note("read")
        defer { reads?.arrive() }
        return try await base.passthroughToken(hash: hash)
    }

    func readPassthroughRefresh(hash: String, clientID: String, owner: String, until: Date, now: Date,
                                answeredBefore: Date) async throws -> PassthroughLeaseAttempt {
        note("readAndLease")
        defer { reads?.arrive() }
        return try await base.readPassthroughRefresh(hash: hash, clientID: clientID, owner: owner, until: until, now: now,
                                                     answeredBefore: answeredBefore)
    }

    func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                   answeredBefore: Date, expiresAt: Date) async throws -> Bool {
        note("acquire")
        return try await base.acquirePassthroughRefresh(hash: hash, clientID: clientID, upstream: upstream, owner: owner, until: until,
                                                        now: now, answeredBefore: answeredBefore, expiresAt: expiresAt)
    }

    func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool {
        note("answer")
        return try await base.answerPassthroughRefresh(hash: hash, sealed: sealed, rotated: rotated, now: now, keepUntil: keepUntil)
    }

    func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws {
        note("release")
        try await base.releasePassthroughRefresh(hash: hash, owner: owner, forget: forget)
    }
}
