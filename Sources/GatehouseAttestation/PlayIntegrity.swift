public import Crypto
public import Foundation

/// What a Play Integrity check needs: the app's package, the two keys of the Play Console
/// ("Manage your own response encryption keys"), the device level required, and how old a
/// verdict may be.
public struct PlayIntegrityPolicy: Sendable {
    public let packageName: String
    let decryptionKey: SymmetricKey
    let verificationKey: P256.Signing.PublicKey
    public let requiredDeviceVerdict: String
    public let maximumAge: TimeInterval

    public init(packageName: String, decryptionKeyBase64: String, verificationKeyBase64: String, requiredDeviceVerdict: String,
                maximumAge: TimeInterval) throws(AttestationError) {
        guard let decryption = PlayIntegrity.base64(decryptionKeyBase64), decryption.count == 32 else {
            throw AttestationError("the Play Integrity decryption key is not 32 bytes of base64")
        }
        guard let verification = PlayIntegrity.base64(verificationKeyBase64),
              let key = try? P256.Signing.PublicKey(derRepresentation: verification) else {
            throw AttestationError("the Play Integrity verification key is not a DER EC P-256 public key")
        }
        self.packageName = packageName
        self.decryptionKey = SymmetricKey(data: decryption)
        self.verificationKey = key
        self.requiredDeviceVerdict = requiredDeviceVerdict
        self.maximumAge = maximumAge
    }
}

/// The verdicts of a verified Play Integrity token.
public struct PlayVerdict: Sendable, Equatable {
    public let appVerdict: String
    public let deviceVerdicts: [String]
}

/// Google Play Integrity verdicts, decrypted and verified locally (no call to Google): the
/// token is a JWE (`A256KW`, `A256GCM`) around a JWS (`ES256`) around the verdict JSON.
public enum PlayIntegrity {
    static let maximumLength = 64 * 1024

    public static func verify(_ token: String, nonce: String, policy: PlayIntegrityPolicy, now: Date) throws(AttestationError) -> PlayVerdict {
        guard token.utf8.count <= maximumLength else { throw AttestationError("the integrity token is too long") }
        let jws = try decrypt(token, key: policy.decryptionKey)
        let payload = try verifySignature(jws, key: policy.verificationKey)
        guard let verdict = (try? JSONSerialization.jsonObject(with: payload)) as? [String: Any] else {
            throw AttestationError("the verdict is not a JSON object")
        }
        let request = verdict["requestDetails"] as? [String: Any]
        guard request?["requestPackageName"] as? String == policy.packageName else {
            throw AttestationError("requestDetails.requestPackageName is not this app's package")
        }
        guard let sent = request?["nonce"] as? String, sent == nonce else {
            throw AttestationError("requestDetails.nonce is not this challenge")
        }
        let milliseconds = (request?["timestampMillis"] as? String).flatMap(Double.init) ?? (request?["timestampMillis"] as? NSNumber)?.doubleValue
        guard let milliseconds else { throw AttestationError("requestDetails.timestampMillis is missing") }
        let age = now.timeIntervalSince1970 - milliseconds / 1000
        guard age <= policy.maximumAge, age >= -60 else { throw AttestationError("the verdict is too old, or from the future") }
        let app = verdict["appIntegrity"] as? [String: Any]
        guard let appVerdict = app?["appRecognitionVerdict"] as? String else {
            throw AttestationError("appIntegrity.appRecognitionVerdict is missing")
        }
        guard appVerdict == "PLAY_RECOGNIZED" else { throw AttestationError("the app is not recognized by Google Play (\(appVerdict.prefix(40)))") }
        guard app?["packageName"] as? String == policy.packageName else {
            throw AttestationError("appIntegrity.packageName is not this app's package")
        }
        let device = ((verdict["deviceIntegrity"] as? [String: Any])?["deviceRecognitionVerdict"] as? [Any])?.compactMap { $0 as? String } ?? []
        guard device.contains(policy.requiredDeviceVerdict) else {
            throw AttestationError("the device does not meet \(policy.requiredDeviceVerdict)")
        }
        return PlayVerdict(appVerdict: appVerdict, deviceVerdicts: device)
    }

    /// JWE compact serialization (RFC 7516 §7.1) with `alg` A256KW and `enc` A256GCM.
    static func decrypt(_ token: String, key: SymmetricKey) throws(AttestationError) -> String {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 5, let headerBytes = base64URL(parts[0]),
              let header = (try? JSONSerialization.jsonObject(with: headerBytes)) as? [String: Any]
        else { throw AttestationError("the integrity token is not a JWE") }
        guard header["alg"] as? String == "A256KW", header["enc"] as? String == "A256GCM" else {
            throw AttestationError("the integrity token must be encrypted with A256KW and A256GCM")
        }
        // RFC 7516 §4.1.13: an extension this reader does not implement, marked critical, refuses the token.
        guard header["crit"] == nil else { throw AttestationError("the integrity token's header has critical extensions (crit)") }
        // §4.1.3: Play never compresses its verdict; a compressed one would be read as garbage.
        guard header["zip"] == nil else { throw AttestationError("the integrity token is compressed (zip), which Play never does") }
        guard let wrapped = base64URL(parts[1]), let iv = base64URL(parts[2]), let ciphertext = base64URL(parts[3]),
              let tag = base64URL(parts[4]), iv.count == 12, tag.count == 16
        else { throw AttestationError("the integrity token's parts are not base64url") }
        do {
            let contentKey = try AES.KeyWrap.unwrap(wrapped, using: key)
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: iv), ciphertext: ciphertext, tag: tag)
            let plaintext = try AES.GCM.open(box, using: contentKey, authenticating: Data(parts[0].utf8))
            guard let jws = String(data: plaintext, encoding: .utf8) else { throw AttestationError("the decrypted token is not text") }
            return jws
        } catch let error as AttestationError {
            throw error
        } catch {
            throw AttestationError("the integrity token cannot be decrypted with the decryption key")
        }
    }

    /// JWS compact serialization with `alg` ES256 (RFC 7515, RFC 7518 §3.4): the payload.
    static func verifySignature(_ jws: String, key: P256.Signing.PublicKey) throws(AttestationError) -> Data {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = base64URL(parts[0]), let payload = base64URL(parts[1]),
              let signature = base64URL(parts[2]),
              let header = (try? JSONSerialization.jsonObject(with: headerBytes)) as? [String: Any]
        else { throw AttestationError("the decrypted token is not a JWS") }
        guard header["alg"] as? String == "ES256" else { throw AttestationError("the verdict must be signed with ES256") }
        guard header["crit"] == nil else { throw AttestationError("the verdict's header has critical extensions (crit)") }
        guard let ecdsa = try? P256.Signing.ECDSASignature(rawRepresentation: signature),
              key.isValidSignature(ecdsa, for: Data((parts[0] + "." + parts[1]).utf8))
        else { throw AttestationError("the verdict's signature is not valid") }
        return payload
    }

    static func base64URL(_ text: String) -> Data? {
        guard !text.contains("="), !text.contains("+"), !text.contains("/") else { return nil }
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    static func base64(_ text: String) -> Data? {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return Data(base64Encoded: trimmed) ?? base64URL(trimmed.replacingOccurrences(of: "=", with: ""))
    }
}
