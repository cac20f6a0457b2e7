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
}
