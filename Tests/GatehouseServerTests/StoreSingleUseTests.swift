import Foundation
import GatehouseCore
import GatehouseStore
import Logging
import Testing

struct StoreSingleUseTests {
    static func openFileStore() async throws -> (SQLiteAuthorizationStore, URL) {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-\(UUID().uuidString).sqlite")
        return (try await SQLiteAuthorizationStore.open(path: url.path, logger: Logger(label: "test")), url)
    }

    @Test func concurrentConsumersOfOneCodeHaveExactlyOneWinner() async throws {
        let (store, url) = try await Self.openFileStore()
        defer { try? FileManager.default.removeItem(at: url) }
        let now = Date()
        try await store.insertCode(sealed: Data("sealed".utf8), codeHash: "h", expiresAt: now.addingTimeInterval(60))
        let winners = try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<50 { group.addTask { try await store.consumeCode(codeHash: "h", now: now) != nil } }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(winners == 1)
        try await store.close()
    }

    @Test func concurrentConsumersOfOneTransactionHaveExactlyOneWinner() async throws {
        let (store, url) = try await Self.openFileStore()
        defer { try? FileManager.default.removeItem(at: url) }
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
        try await store.close()
    }

    @Test func expiredRowsAreNeverReturnedAndAreSwept() async throws {
        let (store, url) = try await Self.openFileStore()
        defer { try? FileManager.default.removeItem(at: url) }
        let now = Date()
        try await store.insertCode(sealed: Data("a".utf8), codeHash: "old", expiresAt: now.addingTimeInterval(-1))
        try await store.insertCode(sealed: Data("b".utf8), codeHash: "new", expiresAt: now.addingTimeInterval(60))
        #expect(try await store.consumeCode(codeHash: "old", now: now) == nil)
        #expect(try await store.sweepExpired(now: now) == 1)
        #expect(try await store.consumeCode(codeHash: "new", now: now) == Data("b".utf8))
        try await store.close()
    }

    @Test func sealedCodeOpensOnlyWithItsOwnCode() throws {
        let issued = IssuedCode(clientID: "c", redirectURI: "r", codeChallenge: "x", upstream: "u",
                                tokenResponse: Data(#"{"access_token":"secret-at"}"#.utf8))
        let sealed = try issued.sealed(with: "the-code")
        #expect(!String(decoding: sealed, as: UTF8.self).contains("secret-at"))
        #expect(try IssuedCode.unsealed(sealed, with: "the-code") == issued)
        #expect(throws: (any Error).self) { try IssuedCode.unsealed(sealed, with: "another-code") }
    }
}
