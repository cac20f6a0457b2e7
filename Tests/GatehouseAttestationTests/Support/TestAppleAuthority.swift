import Crypto
import Foundation
@testable import GatehouseAttestation
import SwiftASN1
import X509

/// A root and an intermediate CA standing in for Apple's App Attestation Root CA and its
/// intermediate (the same shape as `AppleAuthority` in Tests/Support/attestation.py): the
/// verifier is given `rootPEM` in place of Apple's root, exactly as `apple.root_ca_file` does.
struct TestAppleAuthority {
    /// When the certificates were issued: valid from a day before to thirty days after.
    let issued: Date
    private let rootKey = P256.Signing.PrivateKey()
    private let intermediateKey = P256.Signing.PrivateKey()
    let root: Certificate
    let intermediate: Certificate
    private let rootName: DistinguishedName
    private let intermediateName: DistinguishedName

    init(name: String = "Test App Attestation Root CA", issued: Date = Date()) throws {
        self.issued = issued
        rootName = try DistinguishedName { CommonName(name); OrganizationName("Test") }
        intermediateName = try DistinguishedName { CommonName("Test App Attestation CA 1"); OrganizationName("Test") }
        let authority = try Certificate.Extensions {
            Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
            Critical(KeyUsage(keyCertSign: true, cRLSign: true))
        }
        root = try Self.certificate(subject: rootName, issuer: rootName, key: .init(rootKey.publicKey), signer: rootKey,
                                    extensions: authority, issued: issued)
        intermediate = try Self.certificate(subject: intermediateName, issuer: rootName, key: .init(intermediateKey.publicKey),
                                            signer: rootKey, extensions: authority, issued: issued)
    }

    /// The root as `AppAttestPolicy` reads it.
    var rootPEM: String {
        get throws { try root.serializeAsPEM().pemString }
    }

    /// The policy of `appID` trusting this authority's root.
    func policy(appID: String = TestDevice.appID, development: Bool = false) throws -> AppAttestPolicy {
        try AppAttestPolicy(appID: appID, development: development, rootCertificatesPEM: rootPEM)
    }

    /// The credential certificate of a device key, carrying `nonce` in Apple's extension
    /// (`SEQUENCE { [1] EXPLICIT OCTET STRING nonce }`), or no such extension when `nonce` is nil.
    func credentialCertificate(for key: Certificate.PublicKey, nonce: [UInt8]?) throws -> Certificate {
        var extensions = try Certificate.Extensions { Critical(BasicConstraints.notCertificateAuthority) }
        if let nonce {
            let octets = [0x04, UInt8(nonce.count)] + nonce
            let tagged = [0xA1, UInt8(octets.count)] + octets
            let value = [0x30, UInt8(tagged.count)] + tagged
            try extensions.append(Certificate.Extension(oid: AppAttest.nonceExtension, critical: false, value: value[...]))
        }
        return try Self.certificate(subject: try DistinguishedName { CommonName("credential") }, issuer: intermediateName, key: key,
                                    signer: intermediateKey, extensions: extensions, issued: issued)
    }

    static func der(_ certificate: Certificate) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return serializer.serializedBytes
    }

    private static func certificate(subject: DistinguishedName, issuer: DistinguishedName, key: Certificate.PublicKey,
                                    signer: P256.Signing.PrivateKey, extensions: Certificate.Extensions, issued: Date) throws -> Certificate {
        try Certificate(version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: key,
                        notValidBefore: issued.addingTimeInterval(-86_400), notValidAfter: issued.addingTimeInterval(30 * 86_400),
                        issuer: issuer, subject: subject, signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions,
                        issuerPrivateKey: Certificate.PrivateKey(signer))
    }
}

/// An App Attest key in a device's Secure Enclave (P-256; its key id is the SHA-256 of its
/// public key), and what `DCAppAttestService` makes with it: attestations and assertions, each
/// part a parameter a test can change to make one check fail.
struct TestDevice {
    static let appID = "ABCDE12345.com.example.app"

    let authority: TestAppleAuthority
    let key = P256.Signing.PrivateKey()

    var publicKey: Data { key.publicKey.x963Representation }
    var keyID: Data { Data(SHA256.hash(data: publicKey)) }

    /// The client data hash the app attests with: SHA-256 of the challenge (Gatehouse's convention).
    static func clientDataHash(_ challenge: String) -> Data { Data(SHA256.hash(data: Data(challenge.utf8))) }

    /// An attestation object, CBOR `{fmt, attStmt: {x5c: [credential, intermediate], receipt}, authData}`.
    /// Its nonce is SHA-256(authData ‖ clientDataHash) unless `nonce` says otherwise.
    func attest(_ clientDataHash: Data, appID: String = appID, counter: UInt32 = 0, aaguid: [UInt8] = AppAttest.productionAAGUID,
                credentialID: Data? = nil, nonce: [UInt8]? = nil, withNonceExtension: Bool = true, fmt: String = "apple-appattest",
                credentialKey: Certificate.PublicKey? = nil, chain: [CBOR]? = nil) throws -> Data {
        let credential = Array(credentialID ?? keyID)
        let authData = Array(SHA256.hash(data: Data(appID.utf8))) + [0x40] + Self.bigEndian(counter) + aaguid
            + [UInt8(credential.count >> 8), UInt8(credential.count & 0xFF)] + credential + coseKey
        let certified = nonce ?? Array(SHA256.hash(data: Data(authData) + clientDataHash))
        let leaf = try authority.credentialCertificate(for: credentialKey ?? Certificate.PublicKey(key.publicKey),
                                                       nonce: withNonceExtension ? certified : nil)
        let x5c = try chain ?? [.bytes(TestAppleAuthority.der(leaf)), .bytes(TestAppleAuthority.der(authority.intermediate))]
        let statement = CBOR.map([(.text("x5c"), .array(x5c)), (.text("receipt"), .bytes(Array(repeating: 0x30, count: 64)))])
        return Data(CBOR.map([(.text("fmt"), .text(fmt)), (.text("attStmt"), statement), (.text("authData"), .bytes(authData))]).encoded)
    }

    /// An assertion, CBOR `{signature, authenticatorData}`: `signer` signs
    /// SHA-256(authenticatorData ‖ clientDataHash).
    func assert(_ clientDataHash: Data, counter: UInt32, appID: String = appID, signer: P256.Signing.PrivateKey? = nil) throws -> Data {
        let authenticatorData = Array(SHA256.hash(data: Data(appID.utf8))) + [0x40] + Self.bigEndian(counter)
        let nonce = Data(SHA256.hash(data: Data(authenticatorData) + clientDataHash))
        let signature = try (signer ?? key).signature(for: nonce).derRepresentation
        return Data(CBOR.map([(.text("signature"), .bytes(Array(signature))), (.text("authenticatorData"), .bytes(authenticatorData))]).encoded)
    }

    /// The credential public key as COSE (EC2, ES256, P-256), as authenticator data carries it.
    private var coseKey: [UInt8] {
        let point = Array(publicKey)
        return CBOR.map([(.unsigned(1), .unsigned(2)), (.unsigned(3), .negative(6)), (.negative(0), .unsigned(1)),
                         (.negative(1), .bytes(Array(point[1..<33]))), (.negative(2), .bytes(Array(point[33...])))]).encoded
    }

    static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)]
    }
}

extension CBOR {
    /// The value's definite-length encoding (RFC 8949 §3), the inverse of `CBOR.decode`.
    var encoded: [UInt8] {
        switch self {
        case .unsigned(let value): Self.head(0, value)
        case .negative(let value): Self.head(1, value)
        case .bytes(let bytes): Self.head(2, UInt64(bytes.count)) + bytes
        case .text(let text): Self.head(3, UInt64(text.utf8.count)) + Array(text.utf8)
        case .array(let items): Self.head(4, UInt64(items.count)) + items.flatMap(\.encoded)
        case .map(let entries): Self.head(5, UInt64(entries.count)) + entries.flatMap { $0.key.encoded + $0.value.encoded }
        case .bool(let value): [value ? 0xF5 : 0xF4]
        case .null: [0xF6]
        }
    }

    private static func head(_ major: UInt8, _ argument: UInt64) -> [UInt8] {
        let type = major << 5
        let bytes = (0..<8).reversed().map { UInt8(argument >> (8 * UInt64($0)) & 0xFF) }
        switch argument {
        case 0..<24: return [type | UInt8(argument)]
        case 24...0xFF: return [type | 24] + bytes.suffix(1)
        case 0x100...0xFFFF: return [type | 25] + bytes.suffix(2)
        case 0x1_0000...0xFFFF_FFFF: return [type | 26] + bytes.suffix(4)
        default: return [type | 27] + bytes
        }
    }
}
