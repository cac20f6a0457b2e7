import Crypto
import Foundation
@testable import GatehouseAttestation
import Testing

/// Each check of a Play Integrity verdict, decrypted and verified locally: a token made with the
/// console's keys passes, and each check refuses it when only what that check reads is changed.
struct PlayIntegrityTests {
    let console = TestPlayConsole()
    let nonce = "bm9uY2UtMQ"
    let now = Date()

    func verify(_ token: String, nonce: String? = nil, policy: PlayIntegrityPolicy? = nil) throws -> PlayVerdict {
        try PlayIntegrity.verify(token, nonce: nonce ?? self.nonce, policy: policy ?? console.policy(), now: now)
    }

    /// The reason `token` is refused for (the test fails when it is accepted).
    func refusal(_ token: String, nonce: String? = nil, policy: PlayIntegrityPolicy? = nil) throws -> String? {
        let policy = try policy ?? console.policy()
        return #expect(throws: AttestationError.self) { try verify(token, nonce: nonce, policy: policy) }?.description
    }

    /// The reason a token of `verdict` (made with the right keys) is refused for.
    func refusal(of verdict: [String: Any], policy: PlayIntegrityPolicy? = nil) throws -> String? {
        try refusal(console.token(verdict), policy: policy)
    }

    var verdict: [String: Any] { TestPlayConsole.verdict(nonce: nonce, now: now) }

    // MARK: The verdict passes

    @Test func aValidVerdictPassesWithItsVerdicts() throws {
        let verdict = try verify(console.token(verdict))
        #expect(verdict == PlayVerdict(appVerdict: "PLAY_RECOGNIZED", deviceVerdicts: ["MEETS_DEVICE_INTEGRITY"]))
    }

    @Test func aTimestampGivenAsANumberIsRead() throws {
        let numeric = verdict.setting("requestDetails", "timestampMillis", to: Int64(now.timeIntervalSince1970 * 1000))
        #expect(try verify(console.token(numeric)).appVerdict == "PLAY_RECOGNIZED")
    }

    @Test func aDeviceMeetingAStrongerLevelAlsoCarriesTheRequiredOne() throws {
        let strong = verdict.setting("deviceIntegrity", "deviceRecognitionVerdict",
                                     to: ["MEETS_BASIC_INTEGRITY", "MEETS_DEVICE_INTEGRITY", "MEETS_STRONG_INTEGRITY"])
        let passed = try verify(console.token(strong), policy: console.policy(requiredDeviceVerdict: "MEETS_STRONG_INTEGRITY"))
        #expect(passed.deviceVerdicts.contains("MEETS_STRONG_INTEGRITY"))
    }

    // MARK: The envelope (JWE)

    @Test func aTokenOverTheLengthLimitIsRefused() throws {
        #expect(try refusal(String(repeating: "a", count: PlayIntegrity.maximumLength + 1)) == "the integrity token is too long")
    }

    @Test func aTokenThatIsNotAJWEIsRefused() throws {
        let token = try console.token(verdict)
        let fourParts = token.split(separator: ".").dropLast().joined(separator: ".")
        #expect(try refusal(fourParts) == "the integrity token is not a JWE")
        #expect(try refusal("!!.a.b.c.d") == "the integrity token is not a JWE")
    }

    @Test(arguments: [["alg": "RSA-OAEP-256", "enc": "A256GCM"], ["alg": "A256KW", "enc": "A128CBC-HS256"], ["alg": "dir", "enc": "A256GCM"]])
    func anotherEncryptionIsRefused(header: [String: String]) throws {
        #expect(try refusal(console.token(verdict, jweHeader: header)) == "the integrity token must be encrypted with A256KW and A256GCM")
    }

    @Test func aCriticalExtensionInTheEnvelopeIsRefused() throws {
        let token = try console.token(verdict, jweHeader: ["alg": "A256KW", "enc": "A256GCM", "crit": ["exp"], "exp": 1])
        #expect(try refusal(token) == "the integrity token's header has critical extensions (crit)")
    }

    @Test func aCompressedVerdictIsRefused() throws {
        let token = try console.token(verdict, jweHeader: ["alg": "A256KW", "enc": "A256GCM", "zip": "DEF"])
        #expect(try refusal(token) == "the integrity token is compressed (zip), which Play never does")
    }

    @Test func partsThatAreNotBase64URLOrOfTheWrongSizeAreRefused() throws {
        var parts = try console.token(verdict).split(separator: ".").map(String.init)
        var padded = parts
        padded[3] += "=="
        #expect(try refusal(padded.joined(separator: ".")) == "the integrity token's parts are not base64url")
        parts[2] = TestPlayConsole.base64URL(Data(count: 16))  // a 16-byte IV
        #expect(try refusal(parts.joined(separator: ".")) == "the integrity token's parts are not base64url")
    }

    @Test func aTokenForAnotherDecryptionKeyIsRefused() throws {
        let token = try console.token(verdict, encryptionKey: SymmetricKey(size: .bits256))
        #expect(try refusal(token) == "the integrity token cannot be decrypted with the decryption key")
    }

    @Test func aTamperedCiphertextOrHeaderIsRefused() throws {
        let parts = try console.token(verdict).split(separator: ".").map(String.init)
        var ciphertext = try #require(Data(base64Encoded: Self.padded(parts[3])))
        ciphertext[0] ^= 1
        var tampered = parts
        tampered[3] = TestPlayConsole.base64URL(ciphertext)
        #expect(try refusal(tampered.joined(separator: ".")) == "the integrity token cannot be decrypted with the decryption key")
        // The header is authenticated: the same ciphertext under another (still valid) header fails.
        var reheaded = parts
        reheaded[0] = TestPlayConsole.base64URL(Data(#"{"enc":"A256GCM","alg":"A256KW"}"#.utf8))
        #expect(try refusal(reheaded.joined(separator: ".")) == "the integrity token cannot be decrypted with the decryption key")
    }

    // MARK: The signature (JWS)

    @Test func anEnvelopeAroundSomethingElseThanAJWSIsRefused() throws {
        let token = try console.encrypt("not.a.jws.at.all", header: ["alg": "A256KW", "enc": "A256GCM"], key: console.decryptionKey)
        #expect(try refusal(token) == "the decrypted token is not a JWS")
    }

    @Test(arguments: ["HS256", "ES384", "none"])
    func anotherSignatureAlgorithmIsRefused(algorithm: String) throws {
        #expect(try refusal(console.token(verdict, jwsHeader: ["alg": algorithm])) == "the verdict must be signed with ES256")
    }

    @Test func aCriticalExtensionInTheSignatureIsRefused() throws {
        let token = try console.token(verdict, jwsHeader: ["alg": "ES256", "crit": ["b64"], "b64": false])
        #expect(try refusal(token) == "the verdict's header has critical extensions (crit)")
    }

    @Test func aVerdictSignedByAnotherKeyIsRefused() throws {
        let token = try console.token(verdict, signer: P256.Signing.PrivateKey())
        #expect(try refusal(token) == "the verdict's signature is not valid")
    }

    @Test func aVerdictThatIsNotAJSONObjectIsRefused() throws {
        #expect(try refusal(console.token(payload: Data("[1,2]".utf8))) == "the verdict is not a JSON object")
        #expect(try refusal(console.token(payload: Data("not json".utf8))) == "the verdict is not a JSON object")
    }

    // MARK: requestDetails

    @Test func aRequestFromAnotherPackageIsRefused() throws {
        #expect(try refusal(of: verdict.setting("requestDetails", "requestPackageName", to: "com.example.other"))
            == "requestDetails.requestPackageName is not this app's package")
        #expect(try refusal(of: verdict.setting("requestDetails", "requestPackageName", to: nil))
            == "requestDetails.requestPackageName is not this app's package")
    }

    @Test func aVerdictForAnotherNonceIsRefused() throws {
        #expect(try refusal(console.token(verdict), nonce: "bm9uY2UtMg") == "requestDetails.nonce is not this challenge")
        #expect(try refusal(of: verdict.setting("requestDetails", "nonce", to: nil)) == "requestDetails.nonce is not this challenge")
    }

    @Test func aVerdictWithoutTimestampIsRefused() throws {
        #expect(try refusal(of: verdict.setting("requestDetails", "timestampMillis", to: nil)) == "requestDetails.timestampMillis is missing")
        #expect(try refusal(of: verdict.setting("requestDetails", "timestampMillis", to: "yesterday"))
            == "requestDetails.timestampMillis is missing")
    }

    @Test(arguments: [-301.0, 61.0])
    func aVerdictTooOldOrFromTheFutureIsRefused(offset: TimeInterval) throws {
        // maximumAge 300 s; a clock up to 60 s ahead of ours is tolerated.
        let millis = String(Int64(now.addingTimeInterval(offset).timeIntervalSince1970 * 1000))
        #expect(try refusal(of: verdict.setting("requestDetails", "timestampMillis", to: millis)) == "the verdict is too old, or from the future")
    }

    @Test(arguments: [-299.0, 59.0])
    func aVerdictWithinItsAgeIsAccepted(offset: TimeInterval) throws {
        let millis = String(Int64(now.addingTimeInterval(offset).timeIntervalSince1970 * 1000))
        #expect(try verify(console.token(verdict.setting("requestDetails", "timestampMillis", to: millis))).appVerdict == "PLAY_RECOGNIZED")
    }

    // MARK: appIntegrity

    @Test func aVerdictWithoutAppRecognitionIsRefused() throws {
        #expect(try refusal(of: verdict.setting("appIntegrity", "appRecognitionVerdict", to: nil))
            == "appIntegrity.appRecognitionVerdict is missing")
    }

    @Test(arguments: ["UNRECOGNIZED_VERSION", "UNEVALUATED"])
    func anAppPlayDoesNotRecognizeIsRefused(appVerdict: String) throws {
        #expect(try refusal(of: verdict.setting("appIntegrity", "appRecognitionVerdict", to: appVerdict))
            == "the app is not recognized by Google Play (\(appVerdict))")
    }

    @Test func anotherPackagesAppIntegrityIsRefused() throws {
        #expect(try refusal(of: verdict.setting("appIntegrity", "packageName", to: "com.example.repackaged"))
            == "appIntegrity.packageName is not this app's package")
    }

    // MARK: deviceIntegrity

    @Test func aDeviceBelowTheRequiredLevelIsRefused() throws {
        let basic = verdict.setting("deviceIntegrity", "deviceRecognitionVerdict", to: ["MEETS_BASIC_INTEGRITY"])
        #expect(try refusal(of: basic) == "the device does not meet MEETS_DEVICE_INTEGRITY")
        #expect(try refusal(of: verdict, policy: console.policy(requiredDeviceVerdict: "MEETS_STRONG_INTEGRITY"))
            == "the device does not meet MEETS_STRONG_INTEGRITY")
        #expect(try refusal(of: verdict.setting("deviceIntegrity", "deviceRecognitionVerdict", to: nil))
            == "the device does not meet MEETS_DEVICE_INTEGRITY")
    }

    // MARK: The policy

    @Test func thePolicyRefusesKeysItCannotUse() throws {
        let verification = console.signingKey.publicKey.derRepresentation.base64EncodedString()
        #expect(throws: AttestationError.self) {
            try PlayIntegrityPolicy(packageName: "p", decryptionKeyBase64: Data(count: 16).base64EncodedString(), verificationKeyBase64: verification,
                                    requiredDeviceVerdict: "MEETS_DEVICE_INTEGRITY", maximumAge: 60)
        }
        #expect(throws: AttestationError.self) {
            try PlayIntegrityPolicy(packageName: "p", decryptionKeyBase64: Data(count: 32).base64EncodedString(),
                                    verificationKeyBase64: Data(count: 91).base64EncodedString(),
                                    requiredDeviceVerdict: "MEETS_DEVICE_INTEGRITY", maximumAge: 60)
        }
        // The console's base64 is read with surrounding whitespace, and in its URL-safe form.
        let urlSafe = TestPlayConsole.base64URL(Data(repeating: 0xFB, count: 32))
        _ = try PlayIntegrityPolicy(packageName: "p", decryptionKeyBase64: urlSafe + "\n", verificationKeyBase64: verification + "\n",
                                    requiredDeviceVerdict: "MEETS_DEVICE_INTEGRITY", maximumAge: 60)
    }

    static func padded(_ base64URL: String) -> String {
        let base64 = base64URL.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        return base64 + String(repeating: "=", count: (4 - base64.count % 4) % 4)
    }
}
