import Crypto
import Foundation
@testable import GatehouseAttestation
import Testing

/// The small CBOR decoder: what attestation objects use, decoded exactly; everything else, and
/// every hostile input, refused with an error (never a crash, never a huge allocation).
struct CBORTests {
    @Test func theValuesAttestationObjectsUseDecode() throws {
        // {"fmt": "apple-appattest", "n": [1, -2, h'0102', true, null], 24: 500}
        let bytes: [UInt8] = [0xA3, 0x63, 0x66, 0x6D, 0x74, 0x6F] + Array("apple-appattest".utf8)
            + [0x61, 0x6E, 0x85, 0x01, 0x21, 0x42, 0x01, 0x02, 0xF5, 0xF6, 0x18, 0x18, 0x19, 0x01, 0xF4]
        let value = try CBOR.decode(bytes)
        #expect(value["fmt"]?.textString == "apple-appattest")
        #expect(value["n"] == .array([.unsigned(1), .negative(1), .bytes([1, 2]), .bool(true), .null]))
        #expect(value[integer: 24] == .unsigned(500))
        #expect(value[integer: -2] == nil)
    }

    @Test(arguments: [
        ("truncated", [0x62, 0x61] as [UInt8]),
        ("length past the end", [0x5B, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
        ("huge array", [0x9B, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00]),
        ("indefinite", [0x5F, 0x41, 0x00, 0xFF]),
        ("tag", [0xC0, 0x61, 0x61]),
        ("float", [0xFB, 0, 0, 0, 0, 0, 0, 0, 0]),
        ("trailing", [0x01, 0x02]),
        ("repeated key", [0xA2, 0x61, 0x61, 0x01, 0x61, 0x61, 0x02]),
        ("not UTF-8", [0x62, 0xC3, 0x28]),
        ("reserved", [0x1C]),
        ("empty", []),
    ])
    func hostileInputIsRefused(_ name: String, _ bytes: [UInt8]) {
        #expect(throws: AttestationError.self, "\(name)") { try CBOR.decode(bytes) }
    }

    @Test func deepNestingIsRefused() {
        let bytes = [UInt8](repeating: 0x81, count: 100) + [0x01]
        #expect(throws: AttestationError.self) { try CBOR.decode(bytes) }
    }
}

/// What can be checked of App Attest and Play Integrity without a device: the shipped root, the
/// layout of authenticator data, and the refusals of malformed statements. Whole attestation
/// objects, assertions and integrity tokens, check by check, are in `AppAttestTests` and
/// `PlayIntegrityTests` (built with a test authority and test console keys, Support/), and in the
/// end-to-end suite (Tests/Support/attestation.py, with cbor2 and cryptography).
struct AttestationTests {
    @Test func theShippedRootIsApplesAppAttestationRootCA() throws {
        let base64 = AppAttest.appleRootPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let der = try #require(Data(base64Encoded: base64))
        let fingerprint = SHA256.hash(data: der).map { String(format: "%02x", $0) }.joined()
        #expect(fingerprint == "1cb9823ba28ba6ad2d33a006941de2ae4f513ef1d4e831b9f7e0fa7b6242c932")
        _ = try AppAttestPolicy(appID: "ABCDE12345.com.example.app", development: false, rootCertificatesPEM: AppAttest.appleRootPEM)
    }

    @Test func authenticatorDataIsReadAsWebAuthnLaysItOut() throws {
        let rpID = Array(SHA256.hash(data: Data("TEAM.app".utf8)))
        let credential = [UInt8](repeating: 7, count: 32)
        let bytes = rpID + [0x40, 0, 0, 1, 2] + Array("appattestdevelop".utf8) + [0, 32] + credential + [0xA0]
        let parsed = try AuthenticatorData(bytes, attested: true)
        #expect(parsed.rpIDHash == rpID && parsed.counter == 258 && parsed.credentialID == credential)
        #expect(parsed.aaguid == AppAttest.developmentAAGUID)
        #expect(throws: AttestationError.self) { try AuthenticatorData(Array(bytes.prefix(60)), attested: true) }
        #expect(throws: AttestationError.self) { try AuthenticatorData(Array(bytes.prefix(36)), attested: false) }
    }

    @Test func aMalformedAttestationIsRefused() async throws {
        let policy = try AppAttestPolicy(appID: "ABCDE12345.com.example.app", development: false, rootCertificatesPEM: AppAttest.appleRootPEM)
        // {"fmt": "packed"}
        let packed = Data([0xA1, 0x63, 0x66, 0x6D, 0x74, 0x66] + Array("packed".utf8))
        await #expect(throws: AttestationError.self) {
            try await AppAttest.verifyAttestation(packed, keyID: Data(count: 32), clientDataHash: Data(count: 32), policy: policy, now: Date())
        }
        #expect(throws: AttestationError.self) {
            try AppAttest.verifyAssertion(Data([0xA0]), clientDataHash: Data(count: 32), publicKey: Data(count: 65), previousCounter: 0, appID: "a")
        }
    }

    @Test func playIntegrityRefusesWhatIsNotItsJWE() throws {
        let verification = P256.Signing.PrivateKey().publicKey.derRepresentation.base64EncodedString()
        let policy = try PlayIntegrityPolicy(packageName: "com.example.app", decryptionKeyBase64: Data(count: 32).base64EncodedString(),
                                             verificationKeyBase64: verification, requiredDeviceVerdict: "MEETS_DEVICE_INTEGRITY", maximumAge: 60)
        for token in ["", "a.b.c", "a.b.c.d.e", String(repeating: "a", count: 70_000)] {
            #expect(throws: AttestationError.self) { try PlayIntegrity.verify(token, nonce: "n", policy: policy, now: Date()) }
        }
        #expect(throws: AttestationError.self) {
            try PlayIntegrityPolicy(packageName: "p", decryptionKeyBase64: "AAAA", verificationKeyBase64: verification,
                                    requiredDeviceVerdict: "MEETS_DEVICE_INTEGRITY", maximumAge: 60)
        }
    }
}
