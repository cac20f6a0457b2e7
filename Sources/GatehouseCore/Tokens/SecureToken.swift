import Foundation
import Crypto

/// A random, unguessable value: Gatehouse's own `state`, one-time codes, nonces and verifiers.
///
/// Each carries 256 bits from the system's secure generator and is written as 43 base64url
/// characters, which is also a valid PKCE `code_verifier` (RFC 7636 §4.1).
public enum SecureToken {
    /// 32 random bytes as unpadded base64url.
    public static func generate() -> String {
        // Four 64-bit draws (each one `getrandom` call), not 32 one-byte draws.
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for _ in 0..<4 {
            withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) }
        }
        return Base64URL.encode(bytes)
    }

    /// The SHA-256 of a token as unpadded base64url: what the store keeps instead of the token.
    public static func hash(_ token: String) -> String {
        Base64URL.encode(SHA256.hash(data: Data(token.utf8)))
    }

    /// Compares two secrets in time that depends only on their lengths.
    public static func constantTimeEquals(_ lhs: String, _ rhs: String) -> Bool {
        let a = Array(lhs.utf8), b = Array(rhs.utf8)
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }
}
