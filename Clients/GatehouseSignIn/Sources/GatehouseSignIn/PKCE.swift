import Foundation
import Crypto

/// A PKCE pair (RFC 7636, method S256): 32 random bytes as the verifier (43 base64url
/// characters), and the base64url SHA-256 of the verifier as the challenge.
public struct PKCE: Sendable, Equatable {
    public let verifier: String

    public init() {
        self.verifier = Base64URL.encode(randomBytes(32))
    }

    public init(verifier: String) {
        self.verifier = verifier
    }

    public var challenge: String { Self.challenge(of: verifier) }

    public static let method = "S256"

    public static func challenge(of verifier: String) -> String {
        Base64URL.encode(SHA256.hash(data: Data(verifier.utf8)))
    }
}

extension PKCE: CustomStringConvertible, CustomDebugStringConvertible {
    /// Never the verifier.
    public var description: String { "PKCE(S256, verifier: <redacted>)" }
    public var debugDescription: String { description }
}
