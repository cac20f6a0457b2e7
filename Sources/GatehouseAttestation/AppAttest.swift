public import Crypto
public import Foundation
import SwiftASN1
import X509

/// What an App Attest check needs: the App ID (team id + bundle id), the environment, and the
/// trust roots (Apple's App Attestation Root CA, or a test root).
public struct AppAttestPolicy: Sendable {
    public let appID: String
    public let development: Bool
    let roots: [Certificate]

    public init(appID: String, development: Bool, rootCertificatesPEM: String) throws(AttestationError) {
        self.appID = appID
        self.development = development
        do {
            roots = try PEMDocument.parseMultiple(pemString: rootCertificatesPEM).map { try Certificate(pemDocument: $0) }
        } catch {
            throw AttestationError("the App Attest root certificates cannot be read")
        }
        guard !roots.isEmpty else { throw AttestationError("no App Attest root certificate") }
    }
}

/// An attested App Attest key: kept to check the instance's later assertions.
public struct AppAttestKey: Sendable, Equatable {
    /// The P-256 public key, X9.63 uncompressed.
    public let publicKey: Data
    public let counter: UInt32
    /// SHA-256 of `publicKey`: Apple's key identifier.
    public let keyID: Data
}

/// Apple App Attest, verified as Apple's "Validating apps that connect to your server" says.
public enum AppAttest {
    /// The extension of the credential certificate that holds the nonce.
    static let nonceExtension: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 8, 2]
    static let productionAAGUID = Array("appattest".utf8) + [UInt8](repeating: 0, count: 7)
    static let developmentAAGUID = Array("appattestdevelop".utf8)

    /// Verifies an attestation object (CBOR `{fmt, attStmt: {x5c, receipt}, authData}`) for the key
    /// `keyID` and the client data hash the app attested with, at `now`.
    public static func verifyAttestation(_ attestationObject: Data, keyID: Data, clientDataHash: Data, policy: AppAttestPolicy,
                                         now: Date) async throws(AttestationError) -> AppAttestKey {
        let object = try CBOR.decode(Array(attestationObject))
        guard object["fmt"]?.textString == "apple-appattest" else { throw AttestationError("fmt is not apple-appattest") }
        guard let statement = object["attStmt"], let chain = statement["x5c"]?.arrayValue, chain.count >= 2,
              let authData = object["authData"]?.byteString
        else { throw AttestationError("the attestation object lacks attStmt.x5c or authData") }
        let certificates: [Certificate]
        do {
            certificates = try chain.map { item in
                guard let der = item.byteString else { throw AttestationError("x5c holds something else than certificates") }
                return try Certificate(derEncoded: der)
            }
        } catch {
            throw AttestationError("x5c holds a certificate that cannot be read")
        }
        // 1. The chain, leaf to intermediate to the configured root.
        var verifier = Verifier(rootCertificates: CertificateStore(policy.roots)) { RFC5280Policy(validationTime: now) }
        let result = await verifier.validate(leaf: certificates[0], intermediates: CertificateStore(Array(certificates.dropFirst())))
        guard case .validCertificate = result else { throw AttestationError("the certificate chain does not lead to the App Attest root") }
        let leaf = certificates[0]
        // 2–4. The nonce: SHA-256(authData ‖ clientDataHash), in the leaf's extension.
        let nonce = Array(SHA256.hash(data: Data(authData) + clientDataHash))
        guard let extensionValue = leaf.extensions[oid: nonceExtension]?.value, let certified = try? nonceInExtension(Array(extensionValue)),
              certified == nonce
        else { throw AttestationError("the nonce is not the one of this challenge") }
        // 5. The key: its SHA-256 is the key id.
        guard let key = P256.Signing.PublicKey(leaf.publicKey) else { throw AttestationError("the credential key is not P-256") }
        let publicKey = key.x963Representation
        guard Data(SHA256.hash(data: publicKey)) == keyID else { throw AttestationError("the key id is not the hash of the credential key") }
        // 6–9. The authenticator data.
        let parsed = try AuthenticatorData(authData, attested: true)
        guard parsed.rpIDHash == Array(SHA256.hash(data: Data(policy.appID.utf8))) else {
            throw AttestationError("the RP id is not the hash of this App ID")
        }
        guard parsed.counter == 0 else { throw AttestationError("the counter of a new key must be 0") }
        guard parsed.aaguid == (policy.development ? developmentAAGUID : productionAAGUID) else {
            throw AttestationError("the aaguid is not the one of the \(policy.development ? "development" : "production") environment")
        }
        guard parsed.credentialID == Array(keyID) else { throw AttestationError("the credential id is not the key id") }
        return AppAttestKey(publicKey: publicKey, counter: parsed.counter, keyID: keyID)
    }

    /// Verifies an assertion (CBOR `{signature, authenticatorData}`) by the attested key: the
    /// signature over SHA-256(authenticatorData ‖ clientDataHash), the RP id, and a counter above
    /// `previousCounter`. Returns the new counter.
    public static func verifyAssertion(_ assertion: Data, clientDataHash: Data, publicKey: Data, previousCounter: UInt32,
                                       appID: String) throws(AttestationError) -> UInt32 {
        let object = try CBOR.decode(Array(assertion))
        guard let signature = object["signature"]?.byteString, let authenticatorData = object["authenticatorData"]?.byteString else {
            throw AttestationError("the assertion lacks signature or authenticatorData")
        }
        guard let key = try? P256.Signing.PublicKey(x963Representation: publicKey) else {
            throw AttestationError("the kept App Attest key cannot be read")
        }
        let nonce = SHA256.hash(data: Data(authenticatorData) + clientDataHash)
        guard let ecdsa = try? P256.Signing.ECDSASignature(derRepresentation: signature),
              key.isValidSignature(ecdsa, for: Data(nonce))
        else { throw AttestationError("the assertion's signature is not valid") }
        let parsed = try AuthenticatorData(authenticatorData, attested: false)
        guard parsed.rpIDHash == Array(SHA256.hash(data: Data(appID.utf8))) else {
            throw AttestationError("the RP id is not the hash of this App ID")
        }
        guard parsed.counter > previousCounter else { throw AttestationError("the counter did not increase") }
        return parsed.counter
    }

    /// The octet string of the nonce extension: `SEQUENCE { [1] EXPLICIT OCTET STRING }`.
    static func nonceInExtension(_ value: [UInt8]) throws -> [UInt8]? {
        let root = try DER.parse(value)
        guard case .constructed(let children) = root.content else { return nil }
        for child in children where child.identifier == ASN1Identifier(tagWithNumber: 1, tagClass: .contextSpecific) {
            guard case .constructed(let inner) = child.content, let octets = inner.first(where: { _ in true }),
                  octets.identifier == .octetString, case .primitive(let bytes) = octets.content else { return nil }
            return Array(bytes)
        }
        return nil
    }

    /// The Apple App Attestation Root CA (https://www.apple.com/certificateauthority/Apple_App_Attestation_Root_CA.pem,
    /// valid 2020–2045; SHA-256 of its DER 1cb9823ba28ba6ad2d33a006941de2ae4f513ef1d4e831b9f7e0fa7b6242c932).
    public static let appleRootPEM = """
        -----BEGIN CERTIFICATE-----
        MIICITCCAaegAwIBAgIQC/O+DvHN0uD7jG5yH2IXmDAKBggqhkjOPQQDAzBSMSYw
        JAYDVQQDDB1BcHBsZSBBcHAgQXR0ZXN0YXRpb24gUm9vdCBDQTETMBEGA1UECgwK
        QXBwbGUgSW5jLjETMBEGA1UECAwKQ2FsaWZvcm5pYTAeFw0yMDAzMTgxODMyNTNa
        Fw00NTAzMTUwMDAwMDBaMFIxJjAkBgNVBAMMHUFwcGxlIEFwcCBBdHRlc3RhdGlv
        biBSb290IENBMRMwEQYDVQQKDApBcHBsZSBJbmMuMRMwEQYDVQQIDApDYWxpZm9y
        bmlhMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAERTHhmLW07ATaFQIEVwTtT4dyctdh
        NbJhFs/Ii2FdCgAHGbpphY3+d8qjuDngIN3WVhQUBHAoMeQ/cLiP1sOUtgjqK9au
        Yen1mMEvRq9Sk3Jm5X8U62H+xTD3FE9TgS41o0IwQDAPBgNVHRMBAf8EBTADAQH/
        MB0GA1UdDgQWBBSskRBTM72+aEH/pwyp5frq5eWKoTAOBgNVHQ8BAf8EBAMCAQYw
        CgYIKoZIzj0EAwMDaAAwZQIwQgFGnByvsiVbpTKwSga0kP0e8EeDS4+sQmTvb7vn
        53O5+FRXgeLhpJ06ysC5PrOyAjEAp5U4xDgEgllF7En3VcE3iexZZtKeYnpqtijV
        oyFraWVIyd/dganmrduC1bmTBGwD
        -----END CERTIFICATE-----

        """
}

/// WebAuthn authenticator data as App Attest lays it out: RP id hash (32), flags (1), counter
/// (4, big-endian), then for an attestation the attested credential data: aaguid (16), the
/// credential id's length (2) and the credential id.
struct AuthenticatorData {
    let rpIDHash: [UInt8]
    let counter: UInt32
    let aaguid: [UInt8]
    let credentialID: [UInt8]

    init(_ bytes: [UInt8], attested: Bool) throws(AttestationError) {
        guard bytes.count >= 37 else { throw AttestationError("the authenticator data is too short") }
        rpIDHash = Array(bytes[0..<32])
        counter = bytes[33..<37].reduce(0) { $0 << 8 | UInt32($1) }
        guard attested else {
            aaguid = []
            credentialID = []
            return
        }
        guard bytes.count >= 55 else { throw AttestationError("the authenticator data lacks the attested credential") }
        aaguid = Array(bytes[37..<53])
        let length = Int(bytes[53]) << 8 | Int(bytes[54])
        guard bytes.count >= 55 + length else { throw AttestationError("the credential id runs past the authenticator data") }
        credentialID = Array(bytes[55..<(55 + length)])
    }
}
