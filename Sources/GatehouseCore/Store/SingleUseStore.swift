public import Foundation

/// Short-lived values used at most once, shared by every Gatehouse instance: attestation
/// challenges (`attestation`), webview session codes (`session_code`), DPoP proof ids
/// (`dpop_jti`) and Sign in with Apple identity tokens (`apple_identity_token`). Keys are hashes;
/// values never hold a secret in clear.
public protocol SingleUseStore: Sendable {
    /// Inserts unless a live row of that kind and key exists: `false` then (a replay). An expired
    /// row with the same key is replaced.
    func insertOnce(kind: String, keyHash: String, value: Data, expiresAt: Date, now: Date) async throws -> Bool
    /// Deletes and returns the live row; `nil` when unknown, used or expired.
    func consumeOnce(kind: String, keyHash: String, now: Date) async throws -> Data?
    /// `insertOnce` for many keys of one kind with empty values, in one statement (the group
    /// commit of DPoP proof ids): the key hashes inserted; a key left out was a replay. A key
    /// given twice is inserted once.
    func insertEachOnce(kind: String, entries: [SingleUseEntry], now: Date) async throws -> Set<String>
}

/// One key of `SingleUseStore.insertEachOnce`.
public struct SingleUseEntry: Sendable, Equatable {
    public let keyHash: String
    public let expiresAt: Date

    public init(keyHash: String, expiresAt: Date) {
        self.keyHash = keyHash
        self.expiresAt = expiresAt
    }
}

extension [SingleUseEntry] {
    /// The entries without a repeated key (the first of each kept, in order): a statement may
    /// name a row once.
    public var distinctKeys: [SingleUseEntry] {
        var seen: Set<String> = []
        return filter { seen.insert($0.keyHash).inserted }
    }
}

extension SingleUseStore {
    /// One `insertOnce` per key, for stores without a statement of their own.
    public func insertEachOnce(kind: String, entries: [SingleUseEntry], now: Date) async throws -> Set<String> {
        var inserted: Set<String> = []
        for entry in entries where try await insertOnce(kind: kind, keyHash: entry.keyHash, value: Data(), expiresAt: entry.expiresAt, now: now) {
            inserted.insert(entry.keyHash)
        }
        return inserted
    }
}
