import _CryptoExtras
import Crypto
import Foundation
import GatehouseCore
@testable import GatehouseUpstreams
import Testing

/// The `central` kind's own pieces: the S2S signature against vectors made by Node's crypto,
/// the tokens Gatehouse mints, and Sign in with Apple's identity-token checks.
struct CentralTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/central")

    static func fixture(_ name: String) throws -> String {
        try String(contentsOf: fixtures.appendingPathComponent(name), encoding: .utf8)
    }

    struct Vectors: Decodable {
        struct Vector: Decodable {
            let name, path, timestamp, body, canonical, hash, contentSha256, signature: String
        }
        let appId: String
        let privateKeyFile: String
        let vectors: [Vector]
    }

    static func vectors() throws -> Vectors {
        try JSONDecoder().decode(Vectors.self, from: Data(fixture("s2s-vectors.json").utf8))
    }

    @Test func theSignatureIsByteForByteNodes() throws {
        let vectors = try Self.vectors()
        let signer = try CentralRequestSigner(privateKeyPEM: Self.fixture(vectors.privateKeyFile))
        #expect(vectors.vectors.count >= 5)
        for vector in vectors.vectors {
            let canonical = CentralRequestSigner.canonicalPayload(appID: vectors.appId, path: vector.path, body: vector.body,
                                                                  timestamp: vector.timestamp)
            #expect(canonical == vector.canonical, "canonical payload of \(vector.name)")
            #expect(CentralRequestSigner.hexSHA256(Data(canonical.utf8)) == vector.hash, "hash of \(vector.name)")
            #expect(CentralRequestSigner.hexSHA256(Data(vector.body.utf8)) == vector.contentSha256, "content hash of \(vector.name)")
            let signature = try signer.signature(appID: vectors.appId, path: vector.path, body: vector.body, timestamp: vector.timestamp)
            #expect(signature == vector.signature, "signature of \(vector.name)")
        }
    }

    @Test func theHeadersCarryTheMillisecondTimestampAndTheBodyHash() throws {
        let vectors = try Self.vectors()
        let signer = try CentralRequestSigner(privateKeyPEM: Self.fixture(vectors.privateKeyFile))
        let vector = try #require(vectors.vectors.first)
        let headers = try signer.headers(appID: vectors.appId, path: vector.path, body: vector.body,
                                         timestamp: Date(timeIntervalSince1970: Double(vector.timestamp)! / 1000))
        let byName = Dictionary(uniqueKeysWithValues: headers)
        #expect(byName["x-ba-request-timestamp"] == vector.timestamp)
        #expect(byName["x-ba-app"] == vectors.appId)
        #expect(byName["x-amz-content-sha256"] == vector.contentSha256)
        #expect(byName["x-ba-signature"] == vector.signature)
    }

    /// The published client signs `/api/v1/auth/…` and posts it to `{baseUrl}/api/v1/auth/…`; with
    /// `api_base` `{baseUrl}/api` Gatehouse must sign that same path, the one its request carries.
    @Test func theSignedPathIsTheRequestsPathWithTheAPIBasePrefix() throws {
        let target = CentralClient.target(apiBase: "https://www.broccoliapps.com/api", route: "/v1/auth/verify")
        #expect(target.url == "https://www.broccoliapps.com/api/v1/auth/verify")
        #expect(target.signedPath == "/api/v1/auth/verify")
        #expect(CentralClient.target(apiBase: "http://127.0.0.1:8080", route: "/v1/auth/email").signedPath == "/v1/auth/email")
        #expect(CentralClient.target(apiBase: "https://gw.example/tenant/x/api", route: "/v1/auth/verify-native").signedPath
            == "/tenant/x/api/v1/auth/verify-native")
        // The Node vector on the real route, signed through the path Gatehouse derives.
        let vectors = try Self.vectors()
        let vector = try #require(vectors.vectors.first { $0.name == "api-verify" })
        let signer = try CentralRequestSigner(privateKeyPEM: Self.fixture(vectors.privateKeyFile))
        #expect(vector.path == target.signedPath)
        #expect(try signer.signature(appID: vectors.appId, path: target.signedPath, body: vector.body, timestamp: vector.timestamp)
            == vector.signature)
    }

    @Test func stringsAreEscapedAsJSONStringifyDoes() {
        #expect(CentralRequestSigner.javaScriptString("a\"b\\c/d") == #""a\"b\\c/d""#)
        #expect(CentralRequestSigner.javaScriptString("\u{08}\u{0C}\n\r\t\u{01}\u{1F}") == #""\b\f\n\r\t\u0001\u001f""#)
        #expect(CentralRequestSigner.javaScriptString("Zoë \u{2028} 山田") == "\"Zoë \u{2028} 山田\"")
    }

    @Test func aKeyTooSmallIsRefused() throws {
        let small = try _RSA.Signing.PrivateKey(unsafeKeySize: .init(bitCount: 1024)).pemRepresentation
        #expect(throws: (any Error).self) { try CentralRequestSigner(privateKeyPEM: small) }
        #expect(throws: (any Error).self) { try CentralTokenKeys(privateKeyPEMs: [small], issuer: "tasquito") }
    }

    // MARK: - Tokens Gatehouse mints

    static let user = CentralUser(userId: "u-1", email: "zoe@example.test", name: "Zoë Ünal", provider: "google")

    static func verify(_ token: String, with keys: CentralTokenKeys) async throws -> VerifiedJWS {
        let document = keys.jwksDocument
        let cache = JWKSCache(url: "test", fetch: { _ in (200, document) })
        return try await JWSVerifier.verify(token, algorithm: .rs256, keys: cache, hmacSecret: nil)
    }

    @Test func anAccessTokenHasTheSeedsClaimsAndTheKidOfItsKey() async throws {
        let keys = try CentralTokenKeys(privateKeyPEMs: [Self.fixture("jwt-a.pem")], issuer: "tasquito")
        let now = Date(timeIntervalSince1970: 1_764_000_000)
        let token = try keys.accessToken(for: Self.user, issuedAt: now, expiresAt: now.addingTimeInterval(86400))
        let verified = try await Self.verify(token, with: keys)
        #expect(verified.header.keyID == keys.signingKeyID)
        #expect(verified.header.algorithm == "RS256")
        #expect(verified.claims["sub"]?.stringValue == "u-1")
        #expect(verified.claims["iss"]?.stringValue == "tasquito")
        #expect(verified.claims["exp"]?.numberValue == 1_764_086_400)
        let data = try #require(try JSONSerialization.jsonObject(with: verified.payload) as? [String: Any])["data"] as? [String: String]
        #expect(data == ["userId": "u-1", "email": "zoe@example.test", "name": "Zoë Ünal", "provider": "google"])
        // RFC 7638: the kid is the thumbprint of the published key.
        let jwk = try #require(keys.jwks.first)
        let thumbprint = Base64URL.encode(SHA256.hash(data: Data(#"{"e":"\#(jwk["e"]!)","kty":"RSA","n":"\#(jwk["n"]!)"}"#.utf8)))
        #expect(jwk["kid"] == thumbprint)
    }

    @Test func aTokenOfThePreviousKeyStillVerifiesAfterRotation() async throws {
        let before = try CentralTokenKeys(privateKeyPEMs: [Self.fixture("jwt-a.pem")], issuer: "tasquito")
        let after = try CentralTokenKeys(privateKeyPEMs: [Self.fixture("jwt-b.pem"), Self.fixture("jwt-a.pem")], issuer: "tasquito")
        let retired = try CentralTokenKeys(privateKeyPEMs: [Self.fixture("jwt-b.pem")], issuer: "tasquito")
        let now = Date()
        let old = try before.accessToken(for: Self.user, issuedAt: now, expiresAt: now.addingTimeInterval(300))
        let new = try after.accessToken(for: Self.user, issuedAt: now, expiresAt: now.addingTimeInterval(300))
        #expect(after.jwks.count == 2 && after.signingKeyID != before.signingKeyID)
        #expect(try await Self.verify(old, with: after).header.keyID == before.signingKeyID)
        #expect(try await Self.verify(new, with: after).header.keyID == after.signingKeyID)
        await #expect(throws: JOSEError.self) { try await Self.verify(old, with: retired) }
    }

    // MARK: - Sign in with Apple

    static let apple = CentralSettings.Apple(bundleID: "com.broccoliapps.tasquito", jwksURL: "https://apple.test/keys")

    struct AppleKey {
        let keys: CentralTokenKeys
        init(_ file: String) throws { keys = try CentralTokenKeys(privateKeyPEMs: [CentralTests.fixture(file)], issuer: "unused") }
    }

    /// An identity token signed with `key` (RS256; header and claims as given).
    static func appleToken(_ claims: [String: Any], key file: String = "apple-1-private.pem", header: [String: Any]? = nil) throws -> String {
        let pem = try fixture(file)
        let keys = try CentralTokenKeys(privateKeyPEMs: [pem], issuer: "unused")
        let head = header ?? ["alg": "RS256", "kid": keys.signingKeyID]
        let input = Base64URL.encode(try JSONSerialization.data(withJSONObject: head)) + "."
            + Base64URL.encode(try JSONSerialization.data(withJSONObject: claims))
        let signature = try _RSA.Signing.PrivateKey(pemRepresentation: pem).signature(for: Data(input.utf8), padding: .insecurePKCS1v1_5)
        return input + "." + Base64URL.encode(signature.rawRepresentation)
    }

    static func verifier(requireNonce: Bool = true) throws -> AppleIdentityVerifier {
        let document = try CentralTokenKeys(privateKeyPEMs: [fixture("apple-1-private.pem")], issuer: "unused").jwksDocument
        var settings = apple
        settings.requireNonce = requireNonce
        return AppleIdentityVerifier(settings: settings, keys: JWKSCache(url: "test", refetchInterval: .zero, fetch: { _ in (200, document) }))
    }

    static var goodClaims: [String: Any] {
        ["iss": "https://appleid.apple.com", "aud": "com.broccoliapps.tasquito", "exp": Date().timeIntervalSince1970 + 600,
         "iat": Date().timeIntervalSince1970, "sub": "001234.apple", "email": "zoe@privaterelay.appleid.com",
         "nonce": AppleIdentityVerifier.nonceClaim(forRawNonce: "n-1")]
    }

    @Test func aGoodAppleTokenGivesItsSubjectAndEmail() async throws {
        let identity = try await Self.verifier().verify(try Self.appleToken(Self.goodClaims), user: "001234.apple", nonce: "n-1")
        #expect(identity.subject == "001234.apple" && identity.email == "zoe@privaterelay.appleid.com")
        #expect(identity.expiresAt > Date())
        // No nonce sent: accepted only where the app's configuration does not require one.
        _ = try await Self.verifier(requireNonce: false).verify(try Self.appleToken(Self.goodClaims), user: "001234.apple", nonce: nil)
    }

    @Test func theNonceClaimIsTheLowercaseHexSHA256OfTheRawNonce() {
        let claim = AppleIdentityVerifier.nonceClaim(forRawNonce: "n-1")
        #expect(claim == Data(SHA256.hash(data: Data("n-1".utf8))).map { String(format: "%02x", $0) }.joined())
        #expect(claim.count == 64 && claim == claim.lowercased())
    }

    @Test(arguments: [
        ("the raw nonce left out", nil as String?),
        ("the claim itself sent instead of its preimage", AppleIdentityVerifier.nonceClaim(forRawNonce: "n-1")),
        ("the claim in upper case", AppleIdentityVerifier.nonceClaim(forRawNonce: "n-1").uppercased()),
    ])
    func aNonceThatIsNotTheClaimsPreimageIsRefused(what: String, nonce: String?) async throws {
        let token = try Self.appleToken(Self.goodClaims)
        await #expect("\(what)") { try await Self.verifier().verify(token, user: "001234.apple", nonce: nonce) }
            throws: { ($0 as? JOSEError)?.check == "nonce" }
    }

    /// `changes`: claim → new value; "" removes the claim; `exp` is seconds from now.
    @Test(arguments: [
        ("exp", ["exp": "-120"], "001234.apple", "n-1" as String?),
        ("aud", ["aud": "com.other.app"], "001234.apple", "n-1"),
        ("iss", ["iss": "https://evil.example"], "001234.apple", "n-1"),
        ("sub", [:], "someone.else", "n-1"),
        ("nonce", [:], "001234.apple", "n-2"),
        ("nonce", ["nonce": ""], "001234.apple", "n-1"),
        ("email", ["email": ""], "001234.apple", "n-1"),
    ])
    func anAppleTokenFailingOneCheckIsRefused(check: String, changes: [String: String], user: String, nonce: String?) async throws {
        var claims = Self.goodClaims
        for (key, value) in changes {
            claims[key] = value.isEmpty ? nil : key == "exp" ? Date().timeIntervalSince1970 + Double(value)! as Any : value as Any
        }
        let token = try Self.appleToken(claims)
        await #expect { try await Self.verifier().verify(token, user: user, nonce: nonce) } throws: { ($0 as? JOSEError)?.check == check }
    }

    @Test func anAppleTokenOfAnotherKeyOrAlgorithmIsRefused() async throws {
        let verifier = try Self.verifier()
        let unknownKid = try Self.appleToken(Self.goodClaims, key: "apple-2-private.pem")
        await #expect { try await verifier.verify(unknownKid, user: "001234.apple", nonce: nil) } throws: { ($0 as? JOSEError)?.check == "kid" }
        let apple1 = try CentralTokenKeys(privateKeyPEMs: [Self.fixture("apple-1-private.pem")], issuer: "unused").signingKeyID
        let forged = try Self.appleToken(Self.goodClaims, key: "apple-2-private.pem", header: ["alg": "RS256", "kid": apple1])
        await #expect { try await verifier.verify(forged, user: "001234.apple", nonce: nil) } throws: { ($0 as? JOSEError)?.check == "signature" }
        let none = Base64URL.encode(Data(#"{"alg":"none"}"#.utf8)) + "." + Base64URL.encode(try JSONSerialization.data(withJSONObject: Self.goodClaims)) + "."
        await #expect { try await verifier.verify(none, user: "001234.apple", nonce: nil) } throws: { ["alg", "malformed"].contains(($0 as? JOSEError)?.check) }
    }
}
