public import Foundation
import Crypto

/// Seals a value under a key derived (HKDF-SHA256) from a one-time secret the caller holds,
/// such as a Gatehouse code or refresh token: the store keeps the hash of the secret and the
/// sealed value, and only a holder of the secret can open it.
public enum TokenSeal {
    public static func seal(_ plaintext: Data, with secret: String, purpose: String) throws -> Data {
        guard let combined = try AES.GCM.seal(plaintext, using: key(secret, purpose)).combined else {
            throw CryptoKitError.incorrectParameterSize
        }
        return combined
    }

    public static func open(_ sealed: Data, with secret: String, purpose: String) throws -> Data {
        try AES.GCM.open(AES.GCM.SealedBox(combined: sealed), using: key(secret, purpose))
    }

    private static func key(_ secret: String, _ purpose: String) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: Data(secret.utf8)), info: Data(purpose.utf8), outputByteCount: 32)
    }
}
