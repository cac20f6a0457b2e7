public import Foundation
import Crypto

/// The AES-256-GCM keys that seal upstream tokens at rest. The first key seals; every key
/// opens, so a rotated-out key keeps working for what it sealed until re-encryption is done.
///
/// Each ciphertext is stored beside the id of its key, and sealed with associated data (the
/// session id), so a ciphertext copied onto another session does not open.
public struct KeyRing: Sendable {
    public struct Key: Sendable {
        public let id: String
        let key: SymmetricKey
    }

    public let keys: [Key]
    public var activeKeyID: String { keys[0].id }

    /// Reads a key file: one key a line, `ID BASE64URL-32-BYTES`, the sealing key first;
    /// blank lines and `#` comments are ignored.
    public init(parsing text: String) throws(KeyRingError) {
        var keys: [Key] = []
        for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let parts = line.split(separator: " ", omittingEmptySubsequences: true)
            guard parts.count == 2, let bytes = Base64URL.decode(String(parts[1])), bytes.count == 32 else {
                throw KeyRingError("line \(number + 1) is not 'ID BASE64URL-32-BYTES'")
            }
            guard !keys.contains(where: { $0.id == parts[0] }) else { throw KeyRingError("line \(number + 1) repeats the key id \(parts[0])") }
            keys.append(Key(id: String(parts[0]), key: SymmetricKey(data: bytes)))
        }
        guard !keys.isEmpty else { throw KeyRingError("it holds no key") }
        self.keys = keys
    }

    /// A new key line for a key file (`gatehouse keys generate`).
    public static func newKeyLine(id: String = "k" + String(SecureToken.generate().prefix(8))) -> String {
        "\(id) \(SecureToken.generate())"
    }

    /// Seals with the active key; returns its id and the combined nonce, ciphertext and tag.
    public func seal(_ plaintext: Data, associatedData: String) throws -> (keyID: String, sealed: Data) {
        let box = try AES.GCM.seal(plaintext, using: keys[0].key, authenticating: Data(associatedData.utf8))
        guard let combined = box.combined else { throw KeyRingError("sealing failed") }
        return (keys[0].id, combined)
    }

    /// 32 bytes derived (HKDF-SHA256) from each key, in the ring's order, for one `purpose`:
    /// key material of another use that rotates with the ring (Gatehouse's signing keys).
    public func derivedSecrets(purpose: String) -> [Data] {
        keys.map { key in
            HKDF<SHA256>.deriveKey(inputKeyMaterial: key.key, info: Data(purpose.utf8), outputByteCount: 32)
                .withUnsafeBytes { Data($0) }
        }
    }

    /// Opens what any key of the ring sealed; throws for an unknown key or a tampered ciphertext.
    public func open(_ sealed: Data, keyID: String, associatedData: String) throws -> Data {
        guard let key = keys.first(where: { $0.id == keyID }) else { throw KeyRingError("no key \(keyID) in the ring") }
        return try AES.GCM.open(AES.GCM.SealedBox(combined: sealed), using: key.key, authenticating: Data(associatedData.utf8))
    }
}

public struct KeyRingError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
