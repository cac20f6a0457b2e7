import Crypto
import Foundation
@testable import GatehouseCore
import Testing

/// RFC 9449 §4.3's checks, one by one, on proofs built here with swift-crypto (the end-to-end
/// suite builds its proofs with PyJWT, independently of this code).
struct DPoPTests {
    static let url = "https://gatehouse.example.com/api/orders"
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    struct Signer {
        let key = P256.Signing.PrivateKey()
        var jwk: [String: String] {
            let raw = key.publicKey.rawRepresentation
            return ["kty": "EC", "crv": "P-256", "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
        }

        func proof(method: String = "GET", url: String = DPoPTests.url, iat: Double = DPoPTests.now.timeIntervalSince1970,
                   jti: String = SecureToken.generate(), token: String? = nil, nonce: String? = nil, typ: String = "dpop+jwt",
                   alg: String = "ES256", jwk: [String: String]? = nil, extraClaims: [String: Any] = [:]) -> String {
            var header: [String: Any] = ["typ": typ, "alg": alg, "jwk": jwk ?? self.jwk]
            if alg == "none" { header["alg"] = "none" }
            var claims: [String: Any] = ["htm": method, "htu": url, "iat": iat, "jti": jti]
            if let token { claims["ath"] = Base64URL.encode(SHA256.hash(data: Data(token.utf8))) }
            if let nonce { claims["nonce"] = nonce }
            claims.merge(extraClaims) { $1 }
            let input = Base64URL.encode(try! JSONSerialization.data(withJSONObject: header)) + "."
                + Base64URL.encode(try! JSONSerialization.data(withJSONObject: claims))
            let signature = try! key.signature(for: Data(input.utf8)).rawRepresentation
            return input + "." + Base64URL.encode(signature)
        }
    }

    func verify(_ proof: String, method: String = "GET", url: String = DPoPTests.url, token: String? = nil,
                nonces: DPoPNonces? = nil) throws(DPoPProofError) -> VerifiedDPoPProof {
        try DPoPProof.verify(proof, method: method, url: url, accessToken: token, now: Self.now, lifetime: 60, nonces: nonces)
    }

    @Test func aGoodProofGivesTheKeysThumbprint() throws {
        let signer = Signer()
        let verified = try verify(signer.proof(token: "ghd_x"), token: "ghd_x")
        #expect(verified.thumbprint == JSONWebKey.thumbprint(of: signer.jwk))
        // Scheme and host in any case, the default port, no query: the same URI (RFC 9449 §4.3 point 9).
        _ = try verify(signer.proof(url: "HTTPS://Gatehouse.Example.com:443/api/orders"))
        _ = try verify(signer.proof(), url: Self.url + "?page=2")
    }

    @Test func theThumbprintIsRFC7638s() {
        // RFC 7638 §3.1's example key and thumbprint.
        let jwk: [String: Any] = [
            "kty": "RSA", "e": "AQAB", "alg": "RS256", "kid": "2011-04-29",
            "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw",
        ]
        #expect(JSONWebKey.thumbprint(of: jwk) == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
    }

    /// The words of the refusal each check gives: a test that only expected *an* error would
    /// pass if one check caught what another should (or if the first check caught everything).
    static let refusals: [String: String] = [
        "htm": "htm", "htu": "htu", "stale": "iat", "future": "iat", "ath": "ath", "noAth": "ath", "typ": "typ",
        "alg": "alg must be one of", "none": "alg must be one of", "signature": "signature is not valid",
        "privateKey": "private key", "jti": "jti", "notJWT": "not a JWT", "otherCurve": "P-256",
    ]

    @Test(arguments: ["htm", "htu", "stale", "future", "ath", "noAth", "typ", "alg", "none", "signature", "privateKey", "jti", "notJWT",
                      "otherCurve"])
    func eachCheckRefusesOnItsOwn(check: String) {
        let signer = Signer()
        let proof: String
        switch check {
        case "htm": proof = signer.proof(method: "POST", token: "t")
        case "htu": proof = signer.proof(url: "https://gatehouse.example.com/api/other", token: "t")
        case "stale": proof = signer.proof(iat: Self.now.timeIntervalSince1970 - 61, token: "t")
        case "future": proof = signer.proof(iat: Self.now.timeIntervalSince1970 + 61, token: "t")
        case "ath": proof = signer.proof(token: "another token")
        case "noAth": proof = signer.proof()
        case "typ": proof = signer.proof(token: "t", typ: "JWT")
        case "alg": proof = signer.proof(token: "t", alg: "HS256")
        case "none": proof = signer.proof(token: "t", alg: "none")
        case "signature": proof = Signer().proof(token: "t", jwk: signer.jwk)
        case "privateKey": proof = signer.proof(token: "t", jwk: signer.jwk.merging(["d": "AAAA"]) { $1 })
        case "jti": proof = signer.proof(jti: "", token: "t")
        case "notJWT": proof = "a.b"
        default: proof = signer.proof(token: "t", jwk: signer.jwk.merging(["crv": "P-384"]) { $1 })
        }
        do {
            _ = try verify(proof, token: "t")
            Issue.record("the \(check) check let the proof through")
        } catch {
            #expect(error.description.contains(Self.refusals[check] ?? "?"), "\(check): \(error.description)")
        }
    }

    @Test func nonceProofsNeedTheCurrentOrPreviousNonce() throws {
        let nonces = DPoPNonces(key: SymmetricKey(size: .bits256), lifetime: 120)
        let signer = Signer()
        do {
            _ = try verify(signer.proof(), nonces: nonces)
            Issue.record("a proof without a nonce passed")
        } catch {
            #expect(error.useNonce)
        }
        _ = try verify(signer.proof(nonce: nonces.current(now: Self.now)), nonces: nonces)
        #expect(nonces.isValid(nonces.current(now: Self.now.addingTimeInterval(-120)), now: Self.now))
        #expect(!nonces.isValid(nonces.current(now: Self.now.addingTimeInterval(-240)), now: Self.now))
        #expect(!DPoPNonces(key: SymmetricKey(size: .bits256), lifetime: 120).isValid(nonces.current(now: Self.now), now: Self.now))
    }

    @Test func theReplayCacheRemembersUntilExpiryAndStaysBounded() {
        let cache = DPoPReplayCache(maximumEntries: 100)
        #expect(cache.firstUse("a", until: Self.now.addingTimeInterval(60), now: Self.now))
        #expect(!cache.firstUse("a", until: Self.now.addingTimeInterval(60), now: Self.now.addingTimeInterval(30)))
        #expect(cache.firstUse("a", until: Self.now.addingTimeInterval(200), now: Self.now.addingTimeInterval(61)))
        for index in 0..<1000 {
            #expect(cache.firstUse("k\(index)", until: Self.now.addingTimeInterval(600), now: Self.now))
        }
        #expect(cache.count <= 100)
        // The newest are still remembered; the oldest were forgotten (the store answers for them).
        #expect(!cache.firstUse("k999", until: Self.now.addingTimeInterval(600), now: Self.now))
        #expect(cache.firstUse("k0", until: Self.now.addingTimeInterval(600), now: Self.now))
    }

    // MARK: Instance-bound nonces (`dpop.replay_protection: instance_nonce`)

    @Test func anInstanceBoundNonceIsGoodOnlyInItsProcessItsEpochAndTheNext() throws {
        let nonces = DPoPNonces.instanceBound(epoch: 15)
        let nonce = nonces.current(now: Self.now)
        let epoch = nonces.epoch(at: Self.now)
        #expect(nonces.epoch(of: nonce, now: Self.now) == epoch)
        // The proof carries the epoch it was made in.
        #expect(try verify(Signer().proof(nonce: nonce), nonces: nonces).nonceEpoch == epoch)
        // Rolled over once: still good; twice: gone, and the proof is asked for the current nonce.
        let next = nonces.end(of: epoch)
        #expect(nonces.epoch(of: nonce, now: next) == epoch)
        #expect(nonces.epoch(of: nonce, now: nonces.end(of: epoch + 1)) == nil)
        do {
            _ = try DPoPProof.verify(Signer().proof(iat: nonces.end(of: epoch + 1).timeIntervalSince1970, nonce: nonce), method: "GET",
                                     url: Self.url, accessToken: nil, now: nonces.end(of: epoch + 1), lifetime: 60, nonces: nonces)
            Issue.record("a nonce two epochs old passed")
        } catch {
            #expect(error.useNonce)
        }
        // Another process (another instance, or this one after a restart) never accepts it.
        let other = DPoPNonces.instanceBound(epoch: 15)
        #expect(other.epoch(at: Self.now) == epoch)
        #expect(other.epoch(of: nonce, now: Self.now) == nil)
        #expect(nonces.epoch(of: other.current(now: Self.now), now: Self.now) == nil)
        // Nor does a shared nonce of the same epoch under another key pass here, or one from the future.
        #expect(nonces.epoch(of: nonces.current(now: next.addingTimeInterval(15)), now: Self.now) == nil)
    }

    @Test func aForgedInstanceNonceIsRefused() {
        let nonces = DPoPNonces.instanceBound(epoch: 15)
        let nonce = nonces.current(now: Self.now)
        var bytes = [UInt8](Base64URL.decode(nonce)!)
        // The epoch is readable: naming the current one with another MAC, or flipping a MAC bit, fails.
        bytes[23] ^= 1
        #expect(nonces.epoch(of: Base64URL.encode(Data(bytes)), now: Self.now) == nil)
        #expect(nonces.epoch(of: Base64URL.encode(Data(bytes.prefix(8)) + Data(repeating: 0, count: 16)), now: Self.now) == nil)
        for forged in ["", "x", String(repeating: "A", count: 32), nonce + "A", String(nonce.dropLast()), nonce.uppercased()] where forged != nonce {
            #expect(nonces.epoch(of: forged, now: Self.now) == nil, "\(forged)")
        }
    }

    @Test func theEpochSetAnswersAloneUntilItOverflows() {
        let set = EpochReplaySet(maximumEntries: 3)
        #expect(set.firstUse("k:a", epoch: 10, current: 10) == .fresh)
        #expect(set.firstUse("k:a", epoch: 10, current: 10) == .replayed)
        // The same id under another epoch is another proof (its nonce differs).
        #expect(set.firstUse("k:a", epoch: 9, current: 10) == .fresh)
        #expect(set.firstUse("k:b", epoch: 10, current: 10) == .fresh)
        // Full: not remembered, and the epoch can no longer answer alone for anything new.
        #expect(set.firstUse("k:c", epoch: 10, current: 10) == .unknown)
        #expect(set.firstUse("k:c", epoch: 10, current: 10) == .unknown)
        #expect(set.firstUse("k:a", epoch: 10, current: 10) == .replayed)
        // The epoch before the previous one goes whole when a new epoch begins: room again, but
        // epoch 10 stays incomplete (what it did not remember, the store holds).
        #expect(set.firstUse("k:d", epoch: 11, current: 11) == .fresh)
        #expect(set.count == 3)
        #expect(set.firstUse("k:e", epoch: 12, current: 12) == .fresh)
        #expect(set.count == 2)
        #expect(set.firstUse("k:c", epoch: 10, current: 12) == .expired)
        #expect(set.firstUse("k:f", epoch: 11, current: 12) == .fresh)
        #expect(set.isRemembered("k:f", epoch: 11))
        #expect(!set.isRemembered("k:f", epoch: 12))
    }

    @Test func theEpochSetLetsOneOfManyConcurrentUsesThrough() async {
        let set = EpochReplaySet(maximumEntries: 1000)
        let fresh = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<64 { group.addTask { set.firstUse("k:race", epoch: 5, current: 5) == .fresh } }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(fresh == 1)
    }

    @Test func aKeptHeaderStillNeedsItsKeysSignatureAndOnlyAVerifiedOneIsKept() throws {
        let signer = Signer(), forger = Signer()
        // Signed by another key under the app's header: refused, and the header is not kept.
        let forged = forger.proof(token: "t", jwk: signer.jwk)
        let segment = forged.split(separator: ".")[0]
        #expect(throws: DPoPProofError.self) { try verify(forged, token: "t") }
        #expect(ProofHeaders.shared.header(segment) == nil)
        // The app's own proof: verified, its header kept with the key's thumbprint.
        let good = try verify(signer.proof(token: "t"), token: "t")
        #expect(ProofHeaders.shared.header(segment)?.thumbprint == good.thumbprint)
        // The forger again, now that the header is kept: still refused, by the signature.
        do {
            _ = try verify(forger.proof(token: "t", jwk: signer.jwk), token: "t")
            Issue.record("a kept header let another key's signature through")
        } catch {
            #expect(error.description == "the DPoP proof's signature is not valid")
        }
        // And every other check still runs on a kept header.
        do {
            _ = try verify(signer.proof(method: "POST", token: "t"), token: "t")
            Issue.record("a kept header skipped the htm check")
        } catch {
            #expect(error.description.contains("htm"))
        }
    }

    @Test func aProofWhoseEpochEndedMeanwhileIsNeverFreshAgain() {
        let set = EpochReplaySet(maximumEntries: 100)
        #expect(set.firstUse("k:a", epoch: 9, current: 10) == .fresh)
        // Its nonce (epoch 9) checked at the very end of epoch 10, the proof spent once epoch 11
        // began: its set is gone, and neither memory nor the store (which never held it) may say fresh.
        #expect(set.firstUse("k:a", epoch: 9, current: 11) == .expired)
        #expect(set.firstUse("k:b", epoch: 9, current: 11) == .expired)
        #expect(set.isRemembered("k:a", epoch: 9))
        // A clock stepped back into epoch 10 (its nonces of epoch 9 good again) revives nothing.
        #expect(set.firstUse("k:a", epoch: 9, current: 10) == .expired)
        #expect(set.firstUse("k:c", epoch: 10, current: 10) == .fresh)
    }

    @Test func aKeptHeaderIsFoundOnlyByItsExactBytes() throws {
        // A header whose base64url holds a K: the same text with U+212A KELVIN SIGN is equal to it
        // as a Swift string (canonical equivalence), but is no base64url and no JWT.
        var signer = Signer()
        var segment = Substring(signer.proof().split(separator: ".")[0])
        for _ in 0..<200 where !segment.contains("K") {
            signer = Signer()
            segment = Substring(signer.proof().split(separator: ".")[0])
        }
        try #require(segment.contains("K"))
        _ = try verify(signer.proof(token: "t"), token: "t")
        let kelvin = segment.replacingOccurrences(of: "K", with: "\u{212A}")
        #expect(Substring(kelvin) == segment)
        #expect(ProofHeaders.shared.header(Substring(kelvin)) == nil)
        let payload = Base64URL.encode(try JSONSerialization.data(withJSONObject: [
            "htm": "GET", "htu": Self.url, "iat": Self.now.timeIntervalSince1970, "jti": SecureToken.generate()]))
        let input = kelvin + "." + payload
        let forged = input + "." + Base64URL.encode(try signer.key.signature(for: Data(input.utf8)).rawRepresentation)
        do {
            _ = try verify(forged)
            Issue.record("a header that is no base64url was taken from the kept headers")
        } catch {
            #expect(error.description == "the DPoP proof is not a JWT")
        }
    }
}
