import Crypto
import Foundation

/// The cache key of an access token: the SHA-256 of the upstream's name and the token, as
/// four words. The raw token is never a key, never stored and never logged. The upstream is
/// part of the key because two upstreams' identity services may say different things.
public struct TokenKey: Hashable, Sendable {
    let words: (UInt64, UInt64, UInt64, UInt64)

    public init(token: String, upstream: String) {
        var hasher = SHA256()
        var upstream = upstream
        var token = token
        upstream.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        hasher.update(data: [0])
        token.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        let digest = hasher.finalize()
        self.words = digest.withUnsafeBytes { bytes in
            (bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self), bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self),
             bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self), bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
        }
    }

    /// The key as 64 hex digits, to tell other instances which entry to drop.
    public var hex: String {
        [words.0, words.1, words.2, words.3].map { word in
            let digits = String(word, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }.joined()
    }

    public init?(hex: some StringProtocol) {
        let bytes = Array(hex.utf8)
        guard bytes.count == 64 else { return nil }
        var words: [UInt64] = [0, 0, 0, 0]
        for (index, byte) in bytes.enumerated() {
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            default: return nil
            }
            words[index / 16] = words[index / 16] << 4 | UInt64(digit)
        }
        self.words = (words[0], words[1], words[2], words[3])
    }

    public static func == (lhs: TokenKey, rhs: TokenKey) -> Bool {
        lhs.words.0 == rhs.words.0 && lhs.words.1 == rhs.words.1 && lhs.words.2 == rhs.words.2 && lhs.words.3 == rhs.words.3
    }

    public func hash(into hasher: inout Hasher) {
        // The words are already uniformly random; one of them is plenty for the table.
        hasher.combine(words.0)
    }
}
