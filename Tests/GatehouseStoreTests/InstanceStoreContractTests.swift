import Foundation
import GatehouseCore
import GatehouseStore
import Testing

/// The store contract of app instances, on SQLite and PostgreSQL alike: instances (liveness, certification,
/// the App Attest counter's compare-and-set), single-use values, paused certifications, and the
/// DPoP key of a session.
struct InstanceStoreContractTests {
    static func instance(_ id: String = "app~" + SecureToken.generate(), now: Date, lifetime: TimeInterval = 3600) -> InstanceRecord {
        InstanceRecord(id: id, softwareID: "app", dpopJKT: "jkt", createdAt: now, expiresAt: now.addingTimeInterval(lifetime))
    }

    @Test(arguments: StoreKind.available)
    func instancesAreStoredListedTouchedCertifiedAndRevoked(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date(timeIntervalSince1970: 1_800_000_000)
            let first = Self.instance(now: now), second = Self.instance(now: now.addingTimeInterval(1))
            try await store.insertInstance(first)
            try await store.insertInstance(second)
            #expect(try await store.instance(id: first.id) == first)
            #expect(try await store.instances(softwareID: "app").map(\.id) == [second.id, first.id])
            #expect(try await store.instances(softwareID: "other").isEmpty)
            #expect(try await store.instances(softwareID: nil).count == 2)

            try await store.touchInstance(id: first.id, now: now.addingTimeInterval(10), expiresAt: now.addingTimeInterval(7200))
            let touched = try #require(try await store.instance(id: first.id))
            #expect(touched.lastUsedAt == now.addingTimeInterval(10) && touched.expiresAt == now.addingTimeInterval(7200))

            #expect(try await store.certifyInstance(id: first.id, as: .play, now: now))
            #expect(try await store.instance(id: first.id)?.certification == .play)
            #expect(try await store.certifyInstance(id: "app~unknown", as: .manual, now: now) == false)

            #expect(try await store.revokeInstance(id: first.id, now: now))
            #expect(try await store.revokeInstance(id: first.id, now: now) == false)
            let revoked = try #require(try await store.instance(id: first.id))
            #expect(revoked.revokedAt != nil && !revoked.isLive(at: now))
            // A revoked instance is never certified nor touched again.
            #expect(try await store.certifyInstance(id: first.id, as: .manual, now: now) == false)
            try await store.touchInstance(id: first.id, now: now, expiresAt: now.addingTimeInterval(99_999))
            #expect(try await store.instance(id: first.id)?.expiresAt == now.addingTimeInterval(7200))
            // An expired one neither.
            #expect(try await store.certifyInstance(id: second.id, as: .manual, now: now.addingTimeInterval(4000)) == false)
        }
    }

    @Test(arguments: StoreKind.available)
    func theAppleCounterOnlyGrowsAndOnlyOneRacerWins(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let record = Self.instance(now: now)
            try await store.insertInstance(record)
            #expect(try await store.certifyInstance(id: record.id, appleKeyID: "kid", publicKey: Data([4, 1, 2]), counter: 0, now: now))
            let kept = try #require(try await store.instance(id: record.id))
            #expect(kept.certification == .apple && kept.applePublicKey == Data([4, 1, 2]) && kept.appleKeyID == "kid")
            #expect(try await store.advanceAppleCounter(id: record.id, to: 3, now: now))
            #expect(try await store.advanceAppleCounter(id: record.id, to: 3, now: now) == false)
            #expect(try await store.advanceAppleCounter(id: record.id, to: 2, now: now) == false)
            let winners = try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<20 { group.addTask { try await store.advanceAppleCounter(id: record.id, to: 10, now: now) } }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(winners == 1)
            #expect(try await store.instance(id: record.id)?.appleCounter == 10)
        }
    }

    @Test(arguments: StoreKind.available)
    func singleUseValuesAreTakenOnceAndReplaysRefused(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            #expect(try await store.insertOnce(kind: "k", keyHash: "h", value: Data("v".utf8), expiresAt: now.addingTimeInterval(60), now: now))
            #expect(try await store.insertOnce(kind: "k", keyHash: "h", value: Data("w".utf8), expiresAt: now.addingTimeInterval(60), now: now) == false)
            // The same key of another kind is another value.
            #expect(try await store.insertOnce(kind: "other", keyHash: "h", value: Data(), expiresAt: now.addingTimeInterval(60), now: now))
            let winners = try await withThrowingTaskGroup(of: Data?.self) { group in
                for _ in 0..<30 { group.addTask { try await store.consumeOnce(kind: "k", keyHash: "h", now: now) } }
                return try await group.reduce(into: [Data]()) { if let value = $1 { $0.append(value) } }
            }
            #expect(winners == [Data("v".utf8)])
            // An expired row is neither consumed nor in the way of a new one.
            #expect(try await store.insertOnce(kind: "e", keyHash: "h", value: Data("old".utf8), expiresAt: now.addingTimeInterval(1), now: now))
            #expect(try await store.consumeOnce(kind: "e", keyHash: "h", now: now.addingTimeInterval(2)) == nil)
            #expect(try await store.insertOnce(kind: "e", keyHash: "h", value: Data("new".utf8), expiresAt: now.addingTimeInterval(60),
                                               now: now.addingTimeInterval(2)))
            #expect(try await store.consumeOnce(kind: "e", keyHash: "h", now: now.addingTimeInterval(2)) == Data("new".utf8))
            let racers = try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<30 {
                    group.addTask { try await store.insertOnce(kind: "jti", keyHash: "same", value: Data(), expiresAt: now.addingTimeInterval(60), now: now) }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(racers == 1)
        }
    }

    /// The group commit's statement: each key inserted once, a live key left out (a replay), an
    /// expired one replaced, another kind apart; and batches racing over the same keys (two
    /// instances) insert each key exactly once between them.
    @Test(arguments: StoreKind.available)
    func manyKeysAreInsertedOnceInOneStatement(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let live = now.addingTimeInterval(60)
            #expect(try await store.insertOnce(kind: "jti", keyHash: "seen", value: Data(), expiresAt: live, now: now))
            #expect(try await store.insertOnce(kind: "jti", keyHash: "old", value: Data(), expiresAt: now.addingTimeInterval(1), now: now))
            #expect(try await store.insertOnce(kind: "other", keyHash: "a", value: Data(), expiresAt: live, now: now))
            let entries = ["a", "b", "seen", "old"].map { SingleUseEntry(keyHash: $0, expiresAt: live) }
            #expect(try await store.insertEachOnce(kind: "jti", entries: entries, now: now.addingTimeInterval(2)) == ["a", "b", "old"])
            #expect(try await store.insertEachOnce(kind: "jti", entries: entries, now: now.addingTimeInterval(2)) == [])
            #expect(try await store.insertEachOnce(kind: "jti", entries: [], now: now) == [])
            #expect(try await store.insertOnce(kind: "jti", keyHash: "b", value: Data(), expiresAt: live, now: now) == false)
            let keys = (0..<300).map { SingleUseEntry(keyHash: "race-\($0)", expiresAt: live) }
            let inserted = try await withThrowingTaskGroup(of: Set<String>.self) { group in
                for round in 0..<6 {
                    group.addTask { try await store.insertEachOnce(kind: "jti", entries: round % 2 == 0 ? keys : keys.reversed(), now: now) }
                }
                return try await group.reduce(into: [String]()) { $0 += $1 }
            }
            #expect(inserted.count == 300 && Set(inserted).count == 300)
        }
    }

    /// Keys spent at the same time share statements, and each caller learns its own answer.
    @Test(arguments: StoreKind.available)
    func theGroupCommitAnswersEachKeyAsItsOwnInsertWould(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let commit = SingleUseGroupCommit(store: store, kind: "dpop_jti", now: Date.init)
            let live = Date().addingTimeInterval(60)
            let answers = try await withThrowingTaskGroup(of: (String, Bool).self) { group in
                for index in 0..<400 {
                    let key = "k\(index % 200)"  // each key twice
                    group.addTask { (key, try await commit.insertOnce(keyHash: key, expiresAt: live)) }
                }
                return try await group.reduce(into: [String: [Bool]]()) { $0[$1.0, default: []].append($1.1) }
            }
            #expect(answers.count == 200)
            #expect(answers.values.allSatisfy { $0.count == 2 && $0.filter { $0 }.count == 1 }, "each key new exactly once")
            #expect(try await commit.insertOnce(keyHash: "k1", expiresAt: live) == false)
            #expect(try await commit.insertOnce(keyHash: "fresh", expiresAt: live))
        }
    }

    @Test(arguments: StoreKind.available)
    func attemptCountersCountEveryRacerWithinTheirWindow(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            let window = now.addingTimeInterval(60)
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now) == 0)
            #expect(try await store.countAttempt(purpose: "p", keyHash: "a", expiresAt: window, now: now) == 1)
            // Thirty racers (two instances at once, many times over): every one is counted.
            let counts = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<30 { group.addTask { try await store.countAttempt(purpose: "p", keyHash: "a", expiresAt: window, now: now) } }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(Set(counts) == Set(2...31))
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now) == 31)
            // Another key, another purpose: their own counters.
            #expect(try await store.attemptCount(purpose: "p", keyHash: "b", now: now) == 0)
            #expect(try await store.attemptCount(purpose: "q", keyHash: "a", now: now) == 0)
            // A later attempt keeps the running window; once it ends, the count starts again.
            #expect(try await store.countAttempt(purpose: "p", keyHash: "a", expiresAt: now.addingTimeInterval(600), now: now) == 32)
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61)) == 0)
            #expect(try await store.countAttempt(purpose: "p", keyHash: "a", expiresAt: now.addingTimeInterval(200), now: now.addingTimeInterval(61)) == 1)
            // One given back, never below zero.
            try await store.discountAttempt(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61))
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61)) == 0)
            try await store.discountAttempt(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61))
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61)) == 0)
            #expect(try await store.countAttempt(purpose: "p", keyHash: "a", expiresAt: now.addingTimeInterval(200), now: now.addingTimeInterval(61)) == 1)
            try await store.resetAttempts(purpose: "p", keyHash: "a")
            #expect(try await store.attemptCount(purpose: "p", keyHash: "a", now: now.addingTimeInterval(61)) == 0)
            // Swept with the other single-use rows.
            _ = try await store.countAttempt(purpose: "p", keyHash: "c", expiresAt: now.addingTimeInterval(1), now: now)
            #expect(try await store.sweepExpired(now: now.addingTimeInterval(2)) >= 1)
        }
    }

    @Test(arguments: StoreKind.available)
    func certificationTriesAreCountedAndLockAfterTheLast(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            try await store.insertCertification(idHash: "p", sealed: Data("s".utf8), codeHash: "right", expiresAt: now.addingTimeInterval(600))
            #expect(try await store.consumeCertification(idHash: "p", now: now) == nil)  // not verified yet
            #expect(try await store.attemptCertification(idHash: "p", codeHash: "wrong", maximumAttempts: 5, now: now) == .wrong(remaining: 4))
            #expect(try await store.attemptCertification(idHash: "p", codeHash: "right", maximumAttempts: 5, now: now) == .verified(Data("s".utf8)))
            // Verified: answered again without counting, and consumed once.
            #expect(try await store.attemptCertification(idHash: "p", codeHash: "wrong", maximumAttempts: 5, now: now) == .verified(Data("s".utf8)))
            #expect(try await store.consumeCertification(idHash: "p", now: now) == Data("s".utf8))
            #expect(try await store.consumeCertification(idHash: "p", now: now) == nil)

            try await store.insertCertification(idHash: "q", sealed: Data(), codeHash: "right", expiresAt: now.addingTimeInterval(600))
            let outcomes = try await withThrowingTaskGroup(of: CertificationAttempt.self) { group in
                for _ in 0..<8 { group.addTask { try await store.attemptCertification(idHash: "q", codeHash: "wrong", maximumAttempts: 5, now: now) } }
                return try await group.reduce(into: [CertificationAttempt]()) { $0.append($1) }
            }
            // Eight racing tries: exactly five were counted, the others found it locked.
            #expect(outcomes.filter { if case .wrong = $0 { true } else { false } }.count == 5)
            #expect(outcomes.filter { $0 == .locked }.count == 3)
            #expect(try await store.attemptCertification(idHash: "q", codeHash: "right", maximumAttempts: 5, now: now) == .locked)
            #expect(try await store.attemptCertification(idHash: "unknown", codeHash: "x", maximumAttempts: 5, now: now) == .unknown)
            #expect(try await store.attemptCertification(idHash: "q", codeHash: "right", maximumAttempts: 5, now: now.addingTimeInterval(601)) == .unknown)
        }
    }

    @Test(arguments: StoreKind.available)
    func aSessionKeepsItsDPoPKeyAndIsFoundByClient(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            var bound = StoreContractTests.session(now: now)
            bound.dpopJKT = "thumbprint"
            bound.clientID = "app~instance"
            try await store.insertSession(bound)
            try await store.insertSession(StoreContractTests.session(now: now))
            #expect(try await store.session(id: bound.id)?.dpopJKT == "thumbprint")
            try await store.insertAccessToken(hash: "a", sessionID: bound.id, expiresAt: now.addingTimeInterval(60))
            #expect(try await store.session(forAccessTokenHash: "a", now: now)?.session.dpopJKT == "thumbprint")
            #expect(try await store.sessions(clientID: "app~instance").map(\.id) == [bound.id])
        }
    }

    @Test(arguments: StoreKind.available)
    func theSweeperTakesExpiredInstancesValuesAndCertifications(kind: StoreKind) async throws {
        try await withStore(kind) { store in
            let now = Date()
            try await store.insertInstance(Self.instance("app~gone", now: now, lifetime: 1))
            try await store.insertInstance(Self.instance("app~kept", now: now, lifetime: 600))
            _ = try await store.insertOnce(kind: "k", keyHash: "gone", value: Data(), expiresAt: now.addingTimeInterval(1), now: now)
            try await store.insertCertification(idHash: "gone", sealed: Data(), codeHash: "c", expiresAt: now.addingTimeInterval(1))
            #expect(try await store.sweepExpired(now: now.addingTimeInterval(2)) >= 3)
            #expect(try await store.instance(id: "app~gone") == nil)
            #expect(try await store.instance(id: "app~kept") != nil)
        }
    }
}
