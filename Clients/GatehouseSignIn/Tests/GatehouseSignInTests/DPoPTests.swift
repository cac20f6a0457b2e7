import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import GatehouseSignIn
import Testing

/// A DPoP proof taken apart, its ES256 signature checked with Crypto against the `jwk` it carries.
struct DecodedProof {
    let header: [String: Any]
    let claims: [String: Any]
    let jwk: [String: String]
    let signatureIsValid: Bool

    init(_ jwt: String) throws {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        try #require(parts.count == 3)
        let headerBytes = try #require(base64URLDecode(parts[0]))
        let claimBytes = try #require(base64URLDecode(parts[1]))
        let signatureBytes = try #require(base64URLDecode(parts[2]))
        header = try #require(try JSONSerialization.jsonObject(with: headerBytes) as? [String: Any])
        claims = try #require(try JSONSerialization.jsonObject(with: claimBytes) as? [String: Any])
        jwk = try #require(header["jwk"] as? [String: String])
        let x = try #require(base64URLDecode(jwk["x"] ?? ""))
        let y = try #require(base64URLDecode(jwk["y"] ?? ""))
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: x + y)
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: signatureBytes)
        signatureIsValid = publicKey.isValidSignature(signature, for: Data((parts[0] + "." + parts[1]).utf8))
    }

    func claim(_ name: String) -> String? { claims[name] as? String }
}

@Suite("DPoP proofs (RFC 9449)")
struct DPoPTests {
    @Test func aProofVerifiesWithTheKeysPublicKey() throws {
        let key = DPoPKey()
        let issuedAt = Date()
        let proof = try DecodedProof(try key.proof(method: "post", url: URL(string: "https://gatehouse.example/oauth/token?x=1#frag")!,
                                                   issuedAt: issuedAt))
        #expect(proof.signatureIsValid)
        #expect(proof.header["typ"] as? String == "dpop+jwt")
        #expect(proof.header["alg"] as? String == "ES256")
        #expect(proof.jwk["kty"] == "EC")
        #expect(proof.jwk["crv"] == "P-256")
        #expect(proof.jwk.keys.sorted() == ["crv", "kty", "x", "y"], "no private member")
        let raw = key.privateKey.publicKey.rawRepresentation
        #expect(base64URLDecode(proof.jwk["x"]!) == raw.prefix(32))
        #expect(base64URLDecode(proof.jwk["y"]!) == raw.suffix(32))
        #expect(proof.claim("htm") == "POST")
        #expect(proof.claim("htu") == "https://gatehouse.example/oauth/token")
        #expect((proof.claims["iat"] as? NSNumber)?.intValue == Int(issuedAt.timeIntervalSince1970))
        #expect((proof.claim("jti")?.count ?? 0) >= 16)
        #expect(proof.claims["nonce"] == nil)
        #expect(proof.claims["ath"] == nil)
    }

    @Test func aProofSignedByAnotherKeyDoesNotVerify() throws {
        let proof = try DPoPKey().proof(method: "POST", url: URL(string: "https://gatehouse.example/x")!)
        var parts = proof.split(separator: ".").map(String.init)
        let other = try DecodedProof(try DPoPKey().proof(method: "POST", url: URL(string: "https://gatehouse.example/x")!))
        let otherHeader = try JSONSerialization.data(withJSONObject: other.header)
        parts[0] = base64URLEncode(otherHeader)
        #expect(try !DecodedProof(parts.joined(separator: ".")).signatureIsValid)
    }

    @Test func aProofCarriesTheNonceAndTheAccessTokenHash() throws {
        let proof = try DecodedProof(try DPoPKey().proof(method: "GET", url: URL(string: "https://api.example/r")!,
                                                         nonce: "n-1", accessToken: "token"))
        #expect(proof.claim("nonce") == "n-1")
        #expect(proof.claim("ath") == base64URLEncode(SHA256.hash(data: Data("token".utf8))))
        #expect(proof.claim("htm") == "GET")
    }

    @Test func everyProofHasItsOwnID() throws {
        let key = DPoPKey()
        let url = URL(string: "https://gatehouse.example/oauth/token")!
        let ids = try (0..<20).map { _ in try DecodedProof(key.proof(method: "POST", url: url)).claim("jti") }
        #expect(Set(ids).count == 20)
    }

    @Test func theThumbprintIsRFC7638() throws {
        let key = DPoPKey()
        let jwk = key.publicJWK
        let canonical = "{\"crv\":\"P-256\",\"kty\":\"EC\",\"x\":\"\(jwk["x"]!)\",\"y\":\"\(jwk["y"]!)\"}"
        #expect(key.thumbprint == base64URLEncode(SHA256.hash(data: Data(canonical.utf8))))
        #expect(key.thumbprint.count == 43)
        #expect(!String(describing: key).contains(base64URLEncode(key.privateKey.rawRepresentation)))
    }

    @Test func everyRequestOfTheDialogueAndTheTokenRequestCarryAProofOfTheKey() async throws {
        let key = DPoPKey()
        let (client, transport, _) = try await Fixture.signingInClient(dpop: key)
        transport.script(Fixture.step("otp", session: "s2"), Fixture.code(), Fixture.tokens(type: "DPoP"))
        try await client.signIn()
        guard case .finalize(let tokens) = try await client.verifySessionTotpCode("123456") else {
            Issue.record("not finalized")
            return
        }
        #expect(tokens.tokenType == "DPoP")
        let posts = transport.requests.filter { $0.httpMethod == "POST" }
        #expect(posts.count == 4)  // checkAccount, signIn, the TOTP code, the token request
        var ids = Set<String>()
        for request in posts {
            let proof = try DecodedProof(try #require(request.value(forHTTPHeaderField: "DPoP")))
            #expect(proof.signatureIsValid)
            #expect(proof.jwk == key.publicJWK)
            #expect(proof.claim("htm") == "POST")
            #expect(proof.claim("htu") == request.url?.absoluteString)
            let iat = try #require((proof.claims["iat"] as? NSNumber)?.doubleValue)
            #expect(abs(iat - Date().timeIntervalSince1970) < 60)
            ids.insert(try #require(proof.claim("jti")))
        }
        #expect(ids.count == 4)
        #expect(posts.last?.url?.absoluteString == Fixture.tokenEndpoint)
        // The metadata is public: no proof.
        #expect(transport.requests[0].value(forHTTPHeaderField: "DPoP") == nil)
    }

    @Test func useDPoPNonceIsRetriedOnceAndTheNonceKept() async throws {
        let key = DPoPKey()
        let (client, transport, recorder) = try await Fixture.signingInClient(dpop: key)
        transport.script(.json(400, ["error": "use_dpop_nonce"], headers: ["DPoP-Nonce": "nonce-1"]),
                         Fixture.step("otp", session: "s2"),
                         Fixture.step("otp", session: "s3", failure: "invalid_totp_code"))
        #expect(try await client.signIn() == .totpVerificationNeeded)
        #expect(await client.lastError == nil)
        #expect(recorder.names == ["signingIn", "totpVerificationNeeded"])
        let requests = transport.requests
        try #require(requests.count == 4)
        let first = try DecodedProof(try #require(requests[2].value(forHTTPHeaderField: "DPoP")))
        let retry = try DecodedProof(try #require(requests[3].value(forHTTPHeaderField: "DPoP")))
        #expect(first.claims["nonce"] == nil)
        #expect(retry.claim("nonce") == "nonce-1")
        #expect(retry.claim("jti") != first.claim("jti"))
        #expect(requests[3].form == requests[2].form, "the same request again")
        #expect(requests[3].form["password"] == "correct horse")
        // Later proofs carry the nonce without being asked again.
        try await client.verifySessionTotpCode("000000")
        try #require(transport.requests.count == 5)
        let later = try DecodedProof(try #require(transport.requests[4].value(forHTTPHeaderField: "DPoP")))
        #expect(later.claim("nonce") == "nonce-1")
        #expect(transport.requests[4].form["auth_session"] == "s2")
    }

    @Test func useDPoPNonceIsRetriedOnlyOnce() async throws {
        let (client, transport, _) = try await Fixture.signingInClient(dpop: DPoPKey())
        transport.script(.json(400, ["error": "use_dpop_nonce"], headers: ["DPoP-Nonce": "nonce-1"]),
                         .json(400, ["error": "use_dpop_nonce"], headers: ["DPoP-Nonce": "nonce-2"]))
        #expect(try await client.signIn() == .signIn)
        #expect(await client.lastError == .unexpected("use_dpop_nonce"))
        #expect(transport.requests.count == 4)
    }

    @Test func theTokenRequestTakesANonceToo() async throws {
        let (client, transport, _) = try await Fixture.signingInClient(dpop: DPoPKey())
        transport.script(Fixture.code(), .json(400, ["error": "use_dpop_nonce"], headers: ["DPoP-Nonce": "t-nonce"]), Fixture.tokens())
        guard case .finalize = try await client.signIn() else {
            Issue.record("not finalized")
            return
        }
        let requests = transport.requests.suffix(2)
        #expect(requests.allSatisfy { $0.url?.absoluteString == Fixture.tokenEndpoint })
        let retry = try DecodedProof(try #require(requests.last?.value(forHTTPHeaderField: "DPoP")))
        #expect(retry.claim("nonce") == "t-nonce")
        #expect(requests.first?.form == requests.last?.form)
    }

    @Test func withoutAKeyThereIsNoProofAndNoRetry() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(.json(400, ["error": "use_dpop_nonce"], headers: ["DPoP-Nonce": "nonce-1"]))
        #expect(try await client.signIn() == .signIn)
        #expect(transport.requests.count == 3)
        #expect(transport.requests.allSatisfy { $0.value(forHTTPHeaderField: "DPoP") == nil })
    }

    @Test func htuDropsQueryAndFragment() {
        #expect(DPoPKey.htu(URL(string: "https://gatehouse.example:8443/oauth/authorize-challenge?a=b#c")!)
            == "https://gatehouse.example:8443/oauth/authorize-challenge")
    }
}
