import Foundation
import Crypto

/// Proof Key for Code Exchange (RFC 7636), S256 only: `plain` is refused by design.
public enum PKCE {
    /// The one challenge method Gatehouse accepts.
    public static let method = "S256"

    /// `BASE64URL(SHA256(ASCII(code_verifier)))`, RFC 7636 §4.2.
    public static func challenge(for codeVerifier: String) -> String {
        Base64URL.encode(SHA256.hash(data: Data(codeVerifier.utf8)))
    }

    /// A verifier is 43 to 128 characters of `[A-Z] / [a-z] / [0-9] / "-" / "." / "_" / "~"` (RFC 7636 §4.1).
    public static func isWellFormedVerifier(_ codeVerifier: String) -> Bool {
        (43...128).contains(codeVerifier.utf8.count) && codeVerifier.utf8.allSatisfy(isUnreserved)
    }

    /// An S256 challenge is a SHA-256 digest in unpadded base64url: exactly 43 characters.
    public static func isWellFormedChallenge(_ codeChallenge: String) -> Bool {
        codeChallenge.utf8.count == 43 && Base64URL.decode(codeChallenge)?.count == 32
    }

    /// Checks a verifier against the challenge recorded when the flow began, in constant time.
    public static func verify(codeVerifier: String, codeChallenge: String) -> Bool {
        isWellFormedVerifier(codeVerifier)
            && SecureToken.constantTimeEquals(challenge(for: codeVerifier), codeChallenge)
    }

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "_"), UInt8(ascii: "~"):
            true
        default:
            false
        }
    }
}
