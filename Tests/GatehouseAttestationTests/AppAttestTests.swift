import Crypto
import Foundation
@testable import GatehouseAttestation
import Testing
import X509

/// Each step of Apple's "Validating apps that connect to your server", one test apiece: a device's
/// attestation built with a test authority passes, and each step refuses it when only the part
/// that step checks is changed (the nonce is recomputed over changed authenticator data, so the
/// step under test is the one that answers).
struct AppAttestAttestationTests {
    let authority: TestAppleAuthority
    let device: TestDevice
    let challenge = TestDevice.clientDataHash("challenge-1")

    init() throws {
        authority = try TestAppleAuthority()
        device = TestDevice(authority: authority)
    }

    func verify(_ object: Data, keyID: Data? = nil, clientDataHash: Data? = nil, policy: AppAttestPolicy? = nil,
                now: Date = Date()) async throws -> AppAttestKey {
        try await AppAttest.verifyAttestation(object, keyID: keyID ?? device.keyID, clientDataHash: clientDataHash ?? challenge,
                                              policy: policy ?? authority.policy(), now: now)
    }

    /// The reason `object` is refused for (the test fails when it is accepted).
    func refusal(_ object: Data, keyID: Data? = nil, clientDataHash: Data? = nil, policy: AppAttestPolicy? = nil,
                 now: Date = Date()) async throws -> String? {
        let policy = try policy ?? authority.policy()
        let error = await #expect(throws: AttestationError.self) {
            try await verify(object, keyID: keyID, clientDataHash: clientDataHash, policy: policy, now: now)
        }
        return error?.description
    }

    @Test func aValidProductionAttestationPassesAndKeepsTheKeyAtCounterZero() async throws {
        let key = try await verify(try device.attest(challenge))
        #expect(key == AppAttestKey(publicKey: device.publicKey, counter: 0, keyID: device.keyID))
    }

    @Test func aValidDevelopmentAttestationPassesADevelopmentPolicy() async throws {
        let object = try device.attest(challenge, aaguid: AppAttest.developmentAAGUID)
        let key = try await verify(object, policy: authority.policy(development: true))
        #expect(key.keyID == device.keyID)
    }

    @Test func anotherFormatIsRefused() async throws {
        #expect(try await refusal(device.attest(challenge, fmt: "packed")) == "fmt is not apple-appattest")
    }

    @Test func aStatementWithoutTheIntermediateIsRefused() async throws {
        let oneCertificate = try device.attest(challenge, chain: [.bytes(TestAppleAuthority.der(authority.intermediate))])
        #expect(try await refusal(oneCertificate) == "the attestation object lacks attStmt.x5c or authData")
    }

    @Test func aChainHoldingSomethingElseThanCertificatesIsRefused() async throws {
        let garbage = try device.attest(challenge, chain: [.bytes([0x30, 0x03, 0x02, 0x01, 0x01]), .bytes(TestAppleAuthority.der(authority.intermediate))])
        #expect(try await refusal(garbage) == "x5c holds a certificate that cannot be read")
        let text = try device.attest(challenge, chain: [.text("certificate"), .bytes(TestAppleAuthority.der(authority.intermediate))])
        #expect(try await refusal(text) == "x5c holds a certificate that cannot be read")
    }

    @Test func aChainToAnotherRootIsRefused() async throws {
        // A device of another authority (a forger's CA), checked against this authority's root.
        let forged = try TestDevice(authority: TestAppleAuthority(name: "Test App Attestation Root CA")).attest(challenge)
        #expect(try await refusal(forged) == "the certificate chain does not lead to the App Attest root")
    }

    @Test func aChainOutsideItsValidityIsRefused() async throws {
        let object = try device.attest(challenge)
        #expect(try await refusal(object, now: authority.issued.addingTimeInterval(31 * 86_400))
            == "the certificate chain does not lead to the App Attest root")
        #expect(try await refusal(object, now: authority.issued.addingTimeInterval(-2 * 86_400))
            == "the certificate chain does not lead to the App Attest root")
    }

    @Test func anAttestationOfAnotherChallengeIsRefused() async throws {
        let object = try device.attest(challenge)
        #expect(try await refusal(object, clientDataHash: TestDevice.clientDataHash("challenge-2")) == "the nonce is not the one of this challenge")
    }

    @Test func aCertifiedNonceOverOtherDataIsRefused() async throws {
        let object = try device.attest(challenge, nonce: Array(SHA256.hash(data: Data("something else".utf8))))
        #expect(try await refusal(object) == "the nonce is not the one of this challenge")
    }

    @Test func aCredentialCertificateWithoutTheNonceExtensionIsRefused() async throws {
        #expect(try await refusal(device.attest(challenge, withNonceExtension: false)) == "the nonce is not the one of this challenge")
    }

    @Test func aCredentialKeyThatIsNotP256IsRefused() async throws {
        let object = try device.attest(challenge, credentialKey: Certificate.PublicKey(P384.Signing.PrivateKey().publicKey))
        #expect(try await refusal(object) == "the credential key is not P-256")
    }

    @Test func aKeyIDThatIsNotTheHashOfTheCertifiedKeyIsRefused() async throws {
        // The app names another key than the one Apple certified.
        let other = TestDevice(authority: authority)
        let object = try device.attest(challenge, credentialID: other.keyID)
        #expect(try await refusal(object, keyID: other.keyID) == "the key id is not the hash of the credential key")
    }

    @Test func anotherAppsRPIDIsRefused() async throws {
        let object = try device.attest(challenge, appID: "ABCDE12345.com.example.other")
        #expect(try await refusal(object) == "the RP id is not the hash of this App ID")
        // The same object passes for the app it was made for: only the RP id differed.
        _ = try await verify(object, policy: authority.policy(appID: "ABCDE12345.com.example.other"))
    }

    @Test(arguments: [1, 7, UInt32.max])
    func aNewKeyWhoseCounterIsNotZeroIsRefused(counter: UInt32) async throws {
        #expect(try await refusal(device.attest(challenge, counter: counter)) == "the counter of a new key must be 0")
    }

    @Test func aDevelopmentKeyIsRefusedInProduction() async throws {
        let object = try device.attest(challenge, aaguid: AppAttest.developmentAAGUID)
        #expect(try await refusal(object, policy: authority.policy(development: false))
            == "the aaguid is not the one of the production environment")
    }

    @Test func aProductionKeyIsRefusedInDevelopment() async throws {
        let object = try device.attest(challenge, aaguid: AppAttest.productionAAGUID)
        #expect(try await refusal(object, policy: authority.policy(development: true))
            == "the aaguid is not the one of the development environment")
    }

    @Test func anUnknownAAGUIDIsRefused() async throws {
        let object = try device.attest(challenge, aaguid: Array("fido2-authentica".utf8))
        #expect(try await refusal(object) == "the aaguid is not the one of the production environment")
    }

    @Test func aCredentialIDThatIsNotTheKeyIDIsRefused() async throws {
        let object = try device.attest(challenge, credentialID: Data(repeating: 7, count: 32))
        #expect(try await refusal(object) == "the credential id is not the key id")
    }

    @Test func aPolicyWithoutARootIsRefused() {
        #expect(throws: AttestationError.self) { try AppAttestPolicy(appID: TestDevice.appID, development: false, rootCertificatesPEM: "") }
        #expect(throws: AttestationError.self) {
            try AppAttestPolicy(appID: TestDevice.appID, development: false, rootCertificatesPEM: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----")
        }
    }
}

/// An attested key's later assertions: the signature over SHA-256(authenticatorData ‖
/// clientDataHash), the RP id, and a counter that only goes up.
struct AppAttestAssertionTests {
    let device: TestDevice
    let challenge = TestDevice.clientDataHash("request-1")

    init() throws {
        device = TestDevice(authority: try TestAppleAuthority())
    }

    func verify(_ assertion: Data, clientDataHash: Data? = nil, publicKey: Data? = nil, previousCounter: UInt32 = 0,
                appID: String = TestDevice.appID) throws -> UInt32 {
        try AppAttest.verifyAssertion(assertion, clientDataHash: clientDataHash ?? challenge, publicKey: publicKey ?? device.publicKey,
                                      previousCounter: previousCounter, appID: appID)
    }

    func refusal(_ assertion: Data, clientDataHash: Data? = nil, publicKey: Data? = nil, previousCounter: UInt32 = 0,
                 appID: String = TestDevice.appID) -> String? {
        #expect(throws: AttestationError.self) {
            try verify(assertion, clientDataHash: clientDataHash, publicKey: publicKey, previousCounter: previousCounter, appID: appID)
        }?.description
    }

    @Test func aValidAssertionPassesAndGivesItsCounter() throws {
        #expect(try verify(device.assert(challenge, counter: 1)) == 1)
        #expect(try verify(device.assert(challenge, counter: 42), previousCounter: 41) == 42)
    }

    @Test func anAssertionWithoutSignatureOrAuthenticatorDataIsRefused() {
        let empty = Data(CBOR.map([(.text("signature"), .bytes([1]))]).encoded)
        #expect(refusal(empty) == "the assertion lacks signature or authenticatorData")
    }

    @Test func aKeptKeyThatCannotBeReadIsRefused() throws {
        #expect(refusal(try device.assert(challenge, counter: 1), publicKey: Data(count: 65)) == "the kept App Attest key cannot be read")
    }

    @Test func anAssertionByAnotherKeyIsRefused() throws {
        let forged = try device.assert(challenge, counter: 1, signer: P256.Signing.PrivateKey())
        #expect(refusal(forged) == "the assertion's signature is not valid")
    }

    @Test func anAssertionOfAnotherRequestIsRefused() throws {
        let assertion = try device.assert(challenge, counter: 1)
        #expect(refusal(assertion, clientDataHash: TestDevice.clientDataHash("request-2")) == "the assertion's signature is not valid")
    }

    @Test func anotherAppsAssertionIsRefused() throws {
        let assertion = try device.assert(challenge, counter: 1, appID: "ABCDE12345.com.example.other")
        #expect(refusal(assertion) == "the RP id is not the hash of this App ID")
    }

    @Test(arguments: [(UInt32(5), UInt32(5)), (4, 5), (0, 0)])
    func aCounterThatDidNotIncreaseIsRefused(counter: UInt32, previous: UInt32) throws {
        let assertion = try device.assert(challenge, counter: counter)
        #expect(refusal(assertion, previousCounter: previous) == "the counter did not increase")
    }
}
