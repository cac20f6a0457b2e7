import Crypto
import Foundation
import GatehouseAttestation

/// The two keys of the Play Console's "manage your own response encryption keys" (a 32-byte AES
/// decryption key, an EC P-256 verification key) and the integrity tokens Google would send with
/// them: a JWE (A256KW + A256GCM) around a JWS (ES256) around the verdict JSON — the same shape
/// as `PlayKeys` and `integrity_token` in Tests/Support/attestation.py. Every layer is a
/// parameter, so a test can change one and leave the others valid.
struct TestPlayConsole {
    static let packageName = "com.example.app"

    let decryptionKey = SymmetricKey(size: .bits256)
    let signingKey = P256.Signing.PrivateKey()

    func policy(requiredDeviceVerdict: String = "MEETS_DEVICE_INTEGRITY", maximumAge: TimeInterval = 300) throws -> PlayIntegrityPolicy {
        try PlayIntegrityPolicy(packageName: Self.packageName,
                                decryptionKeyBase64: decryptionKey.withUnsafeBytes { Data($0) }.base64EncodedString(),
                                verificationKeyBase64: signingKey.publicKey.derRepresentation.base64EncodedString(),
                                requiredDeviceVerdict: requiredDeviceVerdict, maximumAge: maximumAge)
    }

    /// A verdict as Play Integrity's `decodeIntegrityToken` documents it, for `nonce` at `now`.
    static func verdict(nonce: String, now: Date = Date()) -> [String: Any] {
        [
            "requestDetails": ["requestPackageName": packageName, "nonce": nonce,
                               "timestampMillis": String(Int64(now.timeIntervalSince1970 * 1000))],
            "appIntegrity": ["appRecognitionVerdict": "PLAY_RECOGNIZED", "packageName": packageName,
                             "certificateSha256Digest": ["6a6a1474b5cbbb2b1aa57e0bc3"], "versionCode": "42"],
            "deviceIntegrity": ["deviceRecognitionVerdict": ["MEETS_DEVICE_INTEGRITY"]],
            "accountDetails": ["appLicensingVerdict": "LICENSED"],
        ]
    }

    /// The integrity token of `verdict` (or of raw `payload` bytes), signed and encrypted with
    /// this console's keys unless `signer` or `encryptionKey` says otherwise.
    func token(_ verdict: [String: Any]? = nil, payload: Data? = nil, jwsHeader: [String: Any] = ["alg": "ES256"],
               jweHeader: [String: Any] = ["alg": "A256KW", "enc": "A256GCM"], signer: P256.Signing.PrivateKey? = nil,
               encryptionKey: SymmetricKey? = nil) throws -> String {
        let body = try payload ?? JSONSerialization.data(withJSONObject: verdict ?? [:], options: [.sortedKeys])
        let signingInput = try Self.base64URL(JSONSerialization.data(withJSONObject: jwsHeader, options: [.sortedKeys])) + "."
            + Self.base64URL(body)
        let signature = try (signer ?? signingKey).signature(for: Data(signingInput.utf8)).rawRepresentation
        return try encrypt(signingInput + "." + Self.base64URL(signature), header: jweHeader, key: encryptionKey ?? decryptionKey)
    }

    /// JWE compact serialization (RFC 7516 §7.1): header, wrapped key, IV, ciphertext, tag; the
    /// header's base64url text is the additional authenticated data.
    func encrypt(_ plaintext: String, header: [String: Any], key: SymmetricKey) throws -> String {
        let protected = try Self.base64URL(JSONSerialization.data(withJSONObject: header, options: [.sortedKeys]))
        let contentKey = SymmetricKey(size: .bits256)
        let wrapped = try AES.KeyWrap.wrap(contentKey, using: key)
        let box = try AES.GCM.seal(Data(plaintext.utf8), using: contentKey, nonce: AES.GCM.Nonce(), authenticating: Data(protected.utf8))
        return [protected, Self.base64URL(wrapped), Self.base64URL(Data(box.nonce)), Self.base64URL(box.ciphertext),
                Self.base64URL(box.tag)].joined(separator: ".")
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}

extension Dictionary where Key == String, Value == Any {
    /// A copy with `member` of the object `object` set to `value` (`nil` removes it).
    func setting(_ object: String, _ member: String, to value: Any?) -> [String: Any] {
        var copy = self
        var inner = copy[object] as? [String: Any] ?? [:]
        inner[member] = value
        copy[object] = inner
        return copy
    }
}
