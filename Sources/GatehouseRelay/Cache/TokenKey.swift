import Crypto
import Foundation

/// The cache key of an access token: its SHA-256, as four words. The raw token is never a
/// key, never stored and never logged.
public struct TokenKey: Hashable, Sendable {
    let words: (UInt64, UInt64, UInt64, UInt64)

    public init(token: String) {
        let digest = SHA256.hash(data: Data(token.utf8))
        self.words = digest.withUnsafeBytes { bytes in
            (bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self), bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self),
             bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self), bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
        }
    }

    public static func == (lhs: TokenKey, rhs: TokenKey) -> Bool {
        lhs.words.0 == rhs.words.0 && lhs.words.1 == rhs.words.1 && lhs.words.2 == rhs.words.2 && lhs.words.3 == rhs.words.3
    }

    public func hash(into hasher: inout Hasher) {
        // The words are already uniformly random; one of them is plenty for the table.
        hasher.combine(words.0)
    }
}
