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
                upstream: "u", wiring: .callback, upstreamCodeVerifier: nil, expiresAt: now.addingTimeInterval(600))
            try await store.insertTransaction(transaction, stateHash: "s")
            let results = try await withThrowingTaskGroup(of: AuthorizationTransaction?.self) { group in
                for _ in 0..<50 { group.addTask { try await store.consumeTransaction(stateHash: "s", now: now) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.compactMap { $0 } == [transaction])
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
}
