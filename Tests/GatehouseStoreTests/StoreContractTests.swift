import Foundation
import GatehouseCore
import GatehouseStore
import Testing

/// One contract, every store: what single use, rotation, leases and fencing promise holds for
/// SQLite and PostgreSQL alike.
struct StoreContractTests {
    static func session(_ id: String = SecureToken.generate(), now: Date = Date()) -> SessionRecord {
        SessionRecord(id: id, clientID: "c", upstream: "u", subject: "alice", keyID: "k1", sealedTokens: Data("sealed".utf8),
                      upstreamExpiresAt: now.addingTimeInterval(3600), createdAt: now, expiresAt: now.addingTimeInterval(86400))
    }

    @Test(arguments: StoreKind.available)
    func concurrentConsumersOfOneCodeHaveExactlyOneWinner(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            try await store.insertCode(sealed: Data("sealed".utf8), codeHash: "h", expiresAt: now.addingTimeInterval(60))
            let winners = try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<50 { group.addTask { try await store.consumeCode(codeHash: "h", now: now) != nil } }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(winners == 1)
        }
    }

    @Test(arguments: StoreKind.available)
    func concurrentConsumersOfOneTransactionHaveExactlyOneWinner(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let transaction = AuthorizationTransaction(
                clientID: "c", redirectURI: "com.example.app:/cb", appState: "s", codeChallenge: "x", scopes: [],
                upstream: "u", wiring: .callback, memo: UpstreamMemo(), expiresAt: now.addingTimeInterval(600))
            try await store.insertTransaction(sealed: transaction.sealed(with: "the-state"), stateHash: "s", expiresAt: transaction.expiresAt)
            let results = try await withThrowingTaskGroup(of: Data?.self) { group in
                for _ in 0..<50 { group.addTask { try await store.consumeTransaction(stateHash: "s", now: now) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let won = results.compactMap { $0 }
            #expect(won.count == 1)
            #expect(try won.map { try AuthorizationTransaction.unsealed($0, with: "the-state") } == [transaction])
            // Sealed under the state: another state cannot open it, and the row holds no field in plain text.
            #expect(throws: (any Error).self) { try AuthorizationTransaction.unsealed(won[0], with: "another-state") }
            #expect(!String(decoding: won[0], as: UTF8.self).contains("com.example.app"))
        }
    }

    @Test(arguments: StoreKind.available)
    func expiredRowsAreNeverReturnedAndAreSwept(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            try await store.insertCode(sealed: Data("a".utf8), codeHash: "old", expiresAt: now.addingTimeInterval(-1))
            try await store.insertCode(sealed: Data("b".utf8), codeHash: "new", expiresAt: now.addingTimeInterval(60))
            #expect(try await store.consumeCode(codeHash: "old", now: now) == nil)
            #expect(try await store.sweepExpired(now: now) == 1)
            #expect(try await store.consumeCode(codeHash: "new", now: now) == Data("b".utf8))
        }
    }

    @Test(arguments: StoreKind.available)
    func aRefreshTokenIsReplacedExactlyOnce(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let session = Self.session()
            try await store.insertSession(session)
            try await store.insertRefreshToken(hash: "r1", sessionID: session.id, expiresAt: Date().addingTimeInterval(600))
            let winners = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<50 {
                    group.addTask { try await store.markRefreshTokenReplaced(hash: "r1", successorSealed: Data("pair-\(index)".utf8), now: Date()) }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(winners == 1)
            let record = try #require(try await store.refreshToken(hash: "r1"))
            #expect(record.replacedAt != nil && record.successorSealed != nil)
        }
    }

    @Test(arguments: StoreKind.available)
    func oneRefreshLeaseAtATimeAndAStaleWriterIsFenced(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let session = Self.session(now: now)
            try await store.insertSession(session)
            #expect(try await store.acquireRefreshLease(sessionID: session.id, owner: "a", until: now.addingTimeInterval(15), now: now))
            #expect(try await !store.acquireRefreshLease(sessionID: session.id, owner: "b", until: now.addingTimeInterval(15), now: now))
            // Once the lease has run out, another instance may take it.
            #expect(try await store.acquireRefreshLease(sessionID: session.id, owner: "b", until: now.addingTimeInterval(30),
                                                        now: now.addingTimeInterval(16)))
            #expect(try await store.writeUpstreamTokens(sessionID: session.id, expectedVersion: 1, keyID: "k1", sealed: Data("b".utf8),
                                                        upstreamExpiresAt: nil))
            // "a" wakes up late with version 1: it must not overwrite the newer tokens.
            #expect(try await !store.writeUpstreamTokens(sessionID: session.id, expectedVersion: 1, keyID: "k1", sealed: Data("a".utf8),
                                                         upstreamExpiresAt: nil))
            let stored = try #require(try await store.session(id: session.id))
            #expect(stored.version == 2 && stored.sealedTokens == Data("b".utf8))
        }
    }

    @Test(arguments: StoreKind.available)
    func revokedSessionsAnswerNoAccessToken(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let session = Self.session(now: now)
            try await store.insertSession(session)
            try await store.insertAccessToken(hash: "a1", sessionID: session.id, expiresAt: now.addingTimeInterval(300))
            #expect(try await store.session(forAccessTokenHash: "a1", now: now)?.session.id == session.id)
            #expect(try await store.session(forAccessTokenHash: "a1", now: now.addingTimeInterval(301)) == nil)
            try await store.revokeSession(id: session.id, now: now)
            #expect(try await store.session(forAccessTokenHash: "a1", now: now) == nil)
            #expect(try await store.session(id: session.id)?.revokedAt != nil)
            #expect(try await store.sessions(subject: "alice").count == 1)
            #expect(try await store.sessions(subject: "bob").isEmpty)
        }
    }

    /// A refresh's new pair is bound in one statement: both rows, a hash already bound keeps its
    /// app, the same hash twice is one row.
    @Test(arguments: StoreKind.available)
    func aPairOfPassthroughTokensIsBoundInOneStatement(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let later = Date().addingTimeInterval(86400)
            try await store.bindPassthroughTokens([(hash: "rt", expiresAt: later)], clientID: "app", upstream: "u")
            try await store.bindPassthroughTokens([(hash: "rt", expiresAt: later), (hash: "at2", expiresAt: later),
                                                   (hash: "rt2", expiresAt: later), (hash: "rt2", expiresAt: later)],
                                                  clientID: "third", upstream: "u")
            #expect(try await store.passthroughToken(hash: "rt")?.clientID == "app")
            #expect(try await store.passthroughToken(hash: "at2")?.clientID == "third")
            #expect(try await store.passthroughToken(hash: "rt2")?.clientID == "third")
            try await store.bindPassthroughTokens([], clientID: "none", upstream: "u")
        }
    }

    @Test(arguments: StoreKind.available)
    func oneRefreshOfAPassthroughTokenAtATimeAndTheFirstAnswerWins(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let later = now.addingTimeInterval(86400)
            try await store.bindPassthroughTokens([(hash: "rt", expiresAt: later)], clientID: "app", upstream: "u")
            try await store.bindPassthroughTokens([(hash: "rt", expiresAt: later)], clientID: "other", upstream: "u")  // no effect
            #expect(try await store.passthroughToken(hash: "rt")?.clientID == "app")
            // Another app can never take the lease.
            #expect(try await !store.acquirePassthroughRefresh(hash: "rt", clientID: "other", upstream: "u", owner: "x",
                                                             until: now.addingTimeInterval(10), now: now, answeredBefore: now, expiresAt: later))
            // Of 20 instances racing for the lease, one wins.
            let winners = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<20 {
                    group.addTask {
                        try await store.acquirePassthroughRefresh(hash: "rt", clientID: "app", upstream: "u", owner: "i\(index)",
                                                                  until: now.addingTimeInterval(10), now: now, answeredBefore: now, expiresAt: later)
                    }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(winners == 1)
            // The first answer wins; a second (a stale holder's) is refused.
            #expect(try await store.answerPassthroughRefresh(hash: "rt", sealed: Data("pair".utf8), rotated: true, now: now, keepUntil: later))
            #expect(try await !store.answerPassthroughRefresh(hash: "rt", sealed: Data("other".utf8), rotated: true, now: now, keepUntil: later))
            let record = try #require(try await store.passthroughToken(hash: "rt"))
            #expect(record.answerSealed == Data("pair".utf8) && record.rotated && record.leaseOwner == nil)
            // A rotated token is never refreshed again, even after its lease expired.
            #expect(try await !store.acquirePassthroughRefresh(hash: "rt", clientID: "app", upstream: "u", owner: "y",
                                                             until: now.addingTimeInterval(100), now: now.addingTimeInterval(50),
                                                             answeredBefore: now.addingTimeInterval(50), expiresAt: later))
            // A token never bound (handed out before this version) is bound to its first refresher.
            #expect(try await store.acquirePassthroughRefresh(hash: "legacy", clientID: "app", upstream: "u", owner: "z",
                                                            until: now.addingTimeInterval(10), now: now, answeredBefore: now, expiresAt: later))
            #expect(try await store.passthroughToken(hash: "legacy")?.leaseOwner == "z")
            // An expired lease can be taken over; an unrotated answer may be refreshed again once older than the window.
            #expect(try await store.acquirePassthroughRefresh(hash: "legacy", clientID: "app", upstream: "u", owner: "w",
                                                            until: now.addingTimeInterval(30), now: now.addingTimeInterval(11),
                                                            answeredBefore: now, expiresAt: later))
            #expect(try await store.answerPassthroughRefresh(hash: "legacy", sealed: Data("same".utf8), rotated: false,
                                                           now: now.addingTimeInterval(12), keepUntil: later))
            #expect(try await !store.acquirePassthroughRefresh(hash: "legacy", clientID: "app", upstream: "u", owner: "v",
                                                             until: now.addingTimeInterval(60), now: now.addingTimeInterval(20),
                                                             answeredBefore: now.addingTimeInterval(10), expiresAt: later))
            #expect(try await store.acquirePassthroughRefresh(hash: "legacy", clientID: "app", upstream: "u", owner: "v",
                                                            until: now.addingTimeInterval(60), now: now.addingTimeInterval(50),
                                                            answeredBefore: now.addingTimeInterval(20), expiresAt: later))
            try await store.releasePassthroughRefresh(hash: "legacy", owner: "v", forget: false)
            #expect(try await store.passthroughToken(hash: "legacy")?.leaseOwner == nil)
            #expect(try await store.sweepExpired(now: later.addingTimeInterval(1)) == 2)
        }
    }

    /// The record and the lease in one statement (`readPassthroughRefresh`): the lease is taken
    /// exactly when `acquirePassthroughRefresh` would take it, the record is returned either way,
    /// and a token never bound is only read. The same scenario runs on the store's own statement
    /// and on the protocol's two-statement form, which must agree.
    @Test(arguments: StoreKind.available)
    func thePassthroughRecordIsReadAndItsLeaseTakenInOneStatement(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            try await Self.readAndLease(store, prefix: "own-")
            try await Self.readAndLease(TwoStatements(base: store), prefix: "two-")
        }
    }

    static func readAndLease(_ store: any PassthroughTokenStore, prefix: String) async throws {
        let now = Date()
        let later = now.addingTimeInterval(86400)
        let rt = prefix + "rt"
        func attempt(_ hash: String, client: String = "app", owner: String, at: Date = now, answeredBefore: Date? = nil)
            async throws -> PassthroughLeaseAttempt {
            try await store.readPassthroughRefresh(hash: hash, clientID: client, owner: owner, until: at.addingTimeInterval(10), now: at,
                                                   answeredBefore: answeredBefore ?? at.addingTimeInterval(-30))
        }
        // Never bound: nothing is leased, nothing written.
        #expect(try await attempt(prefix + "unknown", owner: "a") == PassthroughLeaseAttempt(record: nil, leased: false))
        #expect(try await store.passthroughToken(hash: prefix + "unknown") == nil)
        try await store.bindPassthroughTokens([(hash: rt, expiresAt: later)], clientID: "app", upstream: "u")
        // Another app's: read, not leased, unchanged.
        let foreign = try await attempt(rt, client: "other", owner: "x")
        #expect(!foreign.leased && foreign.record?.clientID == "app" && foreign.record?.leaseOwner == nil)
        // Of 20 racing attempts one takes the lease.
        let attempts = try await withThrowingTaskGroup(of: PassthroughLeaseAttempt.self) { group in
            for index in 0..<20 { group.addTask { try await attempt(rt, owner: "i\(index)") } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let winners = attempts.filter(\.leased)
        try #require(winners.count == 1)
        let owner = try #require(winners[0].record?.leaseOwner)
        let until = try #require(winners[0].record?.leaseUntil)
        #expect(abs(until.timeIntervalSince(now.addingTimeInterval(10))) < 0.002)
        // A loser reads the winner's lease, or the record as it was before it (read before the
        // winner's write was committed): never a lease of its own.
        #expect(attempts.filter { !$0.leased }.allSatisfy { $0.record?.clientID == "app" && ($0.record?.leaseOwner ?? owner) == owner })
        #expect(try await store.passthroughToken(hash: rt)?.leaseOwner == owner)
        // The lease, once run out, is taken over.
        #expect(try await attempt(rt, owner: "late", at: now.addingTimeInterval(11)).leased)
        // An answer within the window is read, not leased; a rotated one never is again.
        #expect(try await store.answerPassthroughRefresh(hash: rt, sealed: Data("pair".utf8), rotated: true, now: now, keepUntil: later))
        let replay = try await attempt(rt, owner: "b", at: now.addingTimeInterval(5))
        #expect(!replay.leased && replay.record?.answerSealed == Data("pair".utf8) && replay.record?.rotated == true)
        #expect(try await !attempt(rt, owner: "c", at: now.addingTimeInterval(60)).leased)
        // An unrotated answer older than the window may be refreshed again: the lease clears it.
        let kept = prefix + "kept"
        try await store.bindPassthroughTokens([(hash: kept, expiresAt: later)], clientID: "app", upstream: "u")
        #expect(try await attempt(kept, owner: "d").leased)
        #expect(try await store.answerPassthroughRefresh(hash: kept, sealed: Data("same".utf8), rotated: false, now: now, keepUntil: later))
        #expect(try await !attempt(kept, owner: "e", at: now.addingTimeInterval(10)).leased)
        let again = try await attempt(kept, owner: "f", at: now.addingTimeInterval(60))
        #expect(again.leased && again.record?.answeredAt == nil && again.record?.answerSealed == nil && again.record?.leaseOwner == "f")
        #expect(try await store.passthroughToken(hash: kept)?.answerSealed == nil)
    }
}

/// A store seen through the protocol's two-statement `readPassthroughRefresh` (every other call
/// goes to `base`).
private struct TwoStatements: PassthroughTokenStore {
    let base: any PassthroughTokenStore

    func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws {
        try await base.bindPassthroughTokens(tokens, clientID: clientID, upstream: upstream)
    }

    func passthroughToken(hash: String) async throws -> PassthroughTokenRecord? {
        try await base.passthroughToken(hash: hash)
    }

    func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                   answeredBefore: Date, expiresAt: Date) async throws -> Bool {
        try await base.acquirePassthroughRefresh(hash: hash, clientID: clientID, upstream: upstream, owner: owner, until: until, now: now,
                                                 answeredBefore: answeredBefore, expiresAt: expiresAt)
    }

    func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool {
        try await base.answerPassthroughRefresh(hash: hash, sealed: sealed, rotated: rotated, now: now, keepUntil: keepUntil)
    }

    func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws {
        try await base.releasePassthroughRefresh(hash: hash, owner: owner, forget: forget)
    }
}
