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
}
