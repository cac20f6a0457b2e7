import AsyncHTTPClient
import Crypto
import Foundation
import GatehouseCore
import GatehouseUpstreams
import JWTKit
import Testing

// ID-token and userinfo validation (OpenID Connect Core §3.1.3.7, §5.3.2): each negative case
// asserts the exact check named to the app. Keys are made in-process; the JWKS is served through
// the cache's injected fetch, which counts the requests.

private let issuer = "https://op.example/api/v2"
private let clientID = "gatehouse-client"
private let clientSecret = "a-client-secret-of-the-hs256-upstream-0123456789"
private let expectedNonce = "nonce-bound-to-the-transaction-0123456789abcdef"

/// A 2048-bit RSA key made for these tests only (PKCS#1).
private let rsaPEM = """
-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEAxWmvLDTuiwQGbqgt8EfJGwNnQP8G04N4VOkZSGFzWSHvcWzX
2JFxoA1xtFUhtPh+md+sI39eYOamQCB1P4ju2wzyDDgZ+VUAuuaMB5Cu8ZGEaNvC
MSvf+JKFjUAWkb2oF1txJqKQhPUMvsDbXmZ4FrXjPpQXeugcJTiFyQVlgP85L/Ht
zw7djum33PICmNB8TCh4bgfoBThpf3TgZ4JaQq76Bn6+fENVWOYy2P+Gu5Kj4gsZ
viLvW50JzyGrN/AfWJsWZfybR3KnhbnK+6CCz31woNsjTVjMdcRioTn9XUHEHXdM
uRfbLaZ7CV/TUUjmKvgieSwciVL4HLAq1Wl/xwIDAQABAoIBAF61Kg3qQvq8bp2N
36QjvE5SXqnm745vxz3tKmz4G4+KYUYoMpE6jal8aa1bHjWk9Y+6p+nLxCp23RFs
wPM/LWA3oLPOAmAEsLn5uvoyJkvMRRrNOye95dBp8tpmAa3fsBGsk+c2HGE88uVc
vqFWRYyXrDKsd2tGiaItsLlU9nJgpyizuHMXuPwPzXXR07Fswmh71l53i9nMjyX1
0It2ZiMTkLlGNbHadhYLHbk0NVvPeAlLYbpuLNlDqgf2P92kRWK3H1lCqrNrbQaa
c5KXkwM8qQ6VfObpzND1a+Q4gw4v1r4WJ7aXTjikxOxQN/u5IhelC0SKUdRu1rgc
/1fkNUkCgYEA7pEC8u7O9dXbYFnpKIzR8aZtOt1o9gjRsBg6+jg2y4sWXjZVr4Da
Xm+kWeQ068WPFqfaX2Ayx7z3TjsGSJdyxfKdz2iVvtkxDVcsrXr9RwR2bLBfaS8B
FaEQ4PMsuGf+ij+OXJr+Qtx5yvEEKiTMbcaLZvOmQou3ZJTXOBMk+NUCgYEA09bK
TEiXSXjfXXNbwovbNKWqDa2PH0+aegk/sTvJKbFN+oI1CTeDxOv/33N8MvwISqyz
ByqBH/64ueVpvUiPf377XQUF1qg6WiBrql71zI4u4rFRzo1hdm+WyC+4xnA2EZql
0rnmx+SAD0shwk0aYd1RzHgNAnWmwRx8ezk+5CsCgYEArkb5JIcYYbas4CJOlfTp
meK+gPYmKzYeGMpaq1hNjzw4RvLifadf3wUnxxNTJbnY4fAVMv+PmSKOd3PfD0Cz
869dYZtBaX44u0ontUPXqv2zlYry6GASJr7XGb4LuVsfM9diJHyFqkpuHrcbF75y
KO+V/suXdZ2jh7LD1o8Fv1ECgYAu3oL7xcPTOa8R2ggfTxo817p8ND5KSy5+ebVh
3TxwwQ3jsxNQ6rt4wk5mfgKotSKQgw1JNJpFHfJ5Ds0KWBeHueybdBUKnUXr0uh/
VWtEyuCMv3a+IIHD1oSh3g0fuov78R9nNEJfT6sVtyXM+4ouxOzoNFeMh8NRTqAs
E0pa6QKBgFuJ0jAc73InBkAuOIE05EjEzgppJ1HaT+MjtwhoFaPwzLpsP25+10gi
Ebp+0PV7bqbfddb9aOMq7Og9NwYmRPeGU3J7q2WH6JhyokUcdEXzofai3cQ5beq0
6qoWfPVPNssw/kbB/Mhom/zIDWCAi4ZHDJahs266N34rZ7LB/9fU
-----END RSA PRIVATE KEY-----
"""

/// A signing key of the double: RSA (RS256) or P-256 (ES256).
private enum TestKey: Sendable {
    case rsa(kid: String, key: JWTKit.Insecure.RSA.PrivateKey)
    case ec(kid: String, key: P256.Signing.PrivateKey)

    static func makeRSA(kid: String) throws -> TestKey { .rsa(kid: kid, key: try JWTKit.Insecure.RSA.PrivateKey(pem: rsaPEM)) }
    static func makeEC(kid: String) -> TestKey { .ec(kid: kid, key: P256.Signing.PrivateKey()) }

    var kid: String {
        switch self {
        case .rsa(let kid, _), .ec(let kid, _): kid
        }
    }

    var algorithm: String {
        switch self {
        case .rsa: "RS256"
        case .ec: "ES256"
        }
    }

    /// The public JWK, as a JWKS publishes it.
    func jwk() throws -> [String: String] {
        switch self {
        case .rsa(let kid, let key):
            let primitives = try key.publicKey.getKeyPrimitives()
            return ["kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                    "n": Base64URL.encode(primitives.modulus), "e": Base64URL.encode(primitives.publicExponent)]
        case .ec(let kid, let key):
            let raw = key.publicKey.rawRepresentation
            return ["kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                    "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
        }
    }

    func sign(_ input: Data) async throws -> Data {
        switch self {
        case .rsa(_, let key):
            let collection = JWTKeyCollection()
            await collection.add(rsa: key, digestAlgorithm: .sha256)
            let algorithm = try await collection.getKey()
            return Data(try algorithm.sign(input))
        case .ec(_, let key):
            return try key.signature(for: input).rawRepresentation
        }
    }
}

/// The upstream's JWKS endpoint.
private actor JWKSEndpoint {
    private(set) var fetches = 0
    private var keys: [[String: String]] = []
    private var status = 200

    init(_ keys: [TestKey]) throws { self.keys = try keys.map { try $0.jwk() } }

    func publish(_ keys: [TestKey]) throws { self.keys = try keys.map { try $0.jwk() } }
    func answer(status: Int) { self.status = status }

    func serve() throws -> (status: Int, body: Data) {
        fetches += 1
        let body = try JSONSerialization.data(withJSONObject: ["keys": keys], options: [.sortedKeys])
        return (status, body)
    }

    func cache(refetchInterval: Duration = .seconds(30)) -> JWKSCache {
        JWKSCache(url: "https://op.example/api/v2/jwks", refetchInterval: refetchInterval, retryBackoff: .milliseconds(10),
                  fetch: { _ in try await self.serve() })
    }
}

private func json(_ object: [String: Any]) -> Data {
    try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
}

/// The claims of a valid ID token for alice; `edit` changes them.
private func idClaims(_ edit: (inout [String: Any]) -> Void = { _ in }) -> [String: Any] {
    let now = Int(Date().timeIntervalSince1970)
    var claims: [String: Any] = ["iss": issuer, "sub": "alice", "aud": clientID, "exp": now + 300, "iat": now,
                                 "nonce": expectedNonce, "acr": "eidas1", "sid": "session-1"]
    edit(&claims)
    return claims
}

/// A compact JWS of `claims` signed by `key`; `header` overrides fields of the usual header.
private func mint(_ claims: [String: Any], key: TestKey, header edit: [String: String] = [:]) async throws -> String {
    var header = ["alg": key.algorithm, "typ": "JWT", "kid": key.kid]
    header.merge(edit) { _, new in new }
    let input = Base64URL.encode(json(header)) + "." + Base64URL.encode(json(claims))
    let signature = try await key.sign(Data(input.utf8))
    return input + "." + Base64URL.encode(signature)
}

/// A compact JWS of `claims` with an HS256 signature keyed with `secret`.
private func mintHS256(_ claims: [String: Any], secret: Data, kid: String? = nil) -> String {
    var header = ["alg": "HS256", "typ": "JWT"]
    if let kid { header["kid"] = kid }
    let input = Base64URL.encode(json(header)) + "." + Base64URL.encode(json(claims))
    let mac = HMAC<SHA256>.authenticationCode(for: Data(input.utf8), using: SymmetricKey(data: secret))
    return input + "." + Base64URL.encode(Data(mac))
}

private func expecting(_ algorithm: JWSAlgorithm = .rs256, nonce: String? = expectedNonce, acr: String? = nil,
                       accessToken: String? = nil, leeway: Duration = .seconds(30)) -> IDTokenExpectations {
    IDTokenExpectations(issuer: issuer, clientID: clientID, nonce: nonce, acr: acr, accessToken: accessToken,
                        algorithm: algorithm, leeway: leeway, now: Date())
}

/// The JOSEError `operation` throws (recording an issue when it succeeds or throws something else).
private func joseFailure(_ operation: () async throws -> Void) async -> JOSEError? {
    do {
        try await operation()
    } catch let error as JOSEError {
        return error
    } catch {
        Issue.record("expected a JOSEError, got \(error)")
        return nil
    }
    Issue.record("expected a JOSEError, the check passed")
    return nil
}

/// Validates an RS256 ID token of `claims` against a fresh JWKS holding the test RSA key.
private func rs256Failure(_ claims: [String: Any], expecting expected: IDTokenExpectations = expecting()) async throws -> JOSEError? {
    let key = try TestKey.makeRSA(kid: "rsa-1")
    let cache = try await JWKSEndpoint([key]).cache()
    let token = try await mint(claims, key: key)
    return await joseFailure { _ = try await IDTokenValidator.validate(token, expecting: expected, keys: cache, hmacSecret: nil) }
}

@Suite("ID token validation")
struct IDTokenValidationTests {
    // MARK: accepted

    @Test("a valid RS256 ID token is accepted, its payload kept verbatim")
    func validRS256() async throws {
        let key = try TestKey.makeRSA(kid: "rsa-1")
        let endpoint = try JWKSEndpoint([key, TestKey.makeEC(kid: "ec-1")])
        let cache = await endpoint.cache()
        let claims = idClaims { $0["at_hash"] = IDTokenValidator.accessTokenHash("the-access-token") }
        let token = try await mint(claims, key: key)
        let validated = try await IDTokenValidator.validate(token, expecting: expecting(acr: "eidas1", accessToken: "the-access-token"),
                                                            keys: cache, hmacSecret: nil)
        #expect(validated.subject == "alice")
        #expect(validated.sessionID == "session-1")
        #expect(validated.acr == "eidas1")
        #expect(validated.payload == json(claims))
        #expect(await endpoint.fetches == 1)
    }

    @Test("a valid ES256 ID token is accepted")
    func validES256() async throws {
        let key = TestKey.makeEC(kid: "ec-1")
        let cache = try await JWKSEndpoint([try TestKey.makeRSA(kid: "rsa-1"), key]).cache()
        let token = try await mint(idClaims(), key: key)
        let validated = try await IDTokenValidator.validate(token, expecting: expecting(.es256), keys: cache, hmacSecret: nil)
        #expect(validated.subject == "alice")
    }

    @Test("a valid HS256 ID token keyed with the client secret is accepted")
    func validHS256() async throws {
        let token = mintHS256(idClaims(), secret: Data(clientSecret.utf8))
        let validated = try await IDTokenValidator.validate(token, expecting: expecting(.hs256), keys: nil, hmacSecret: Secret(clientSecret))
        #expect(validated.subject == "alice")
    }

    @Test("a token expired within the leeway is accepted")
    func expiredWithinLeeway() async throws {
        let key = try TestKey.makeRSA(kid: "rsa-1")
        let cache = try await JWKSEndpoint([key]).cache()
        let token = try await mint(idClaims { $0["exp"] = Int(Date().timeIntervalSince1970) - 10 }, key: key)
        let validated = try await IDTokenValidator.validate(token, expecting: expecting(leeway: .seconds(30)), keys: cache, hmacSecret: nil)
        #expect(validated.subject == "alice")
    }

    // MARK: refused

    @Test("wrong nonce")
    func wrongNonce() async throws {
        let error = try await rs256Failure(idClaims { $0["nonce"] = "another-transactions-nonce-0123456789abcdef" })
        #expect(error?.check == "nonce")
    }

    @Test("missing nonce when one was sent")
    func missingNonce() async throws {
        let error = try await rs256Failure(idClaims { $0["nonce"] = nil })
        #expect(error?.check == "nonce")
    }

    @Test("wrong aud")
    func wrongAudience() async throws {
        let error = try await rs256Failure(idClaims { $0["aud"] = "another-client" })
        #expect(error?.check == "aud")
    }

    @Test("several audiences without azp")
    func severalAudiencesWithoutAzp() async throws {
        let error = try await rs256Failure(idClaims { $0["aud"] = [clientID, "another-client"] })
        #expect(error?.check == "azp")
    }

    @Test("wrong iss")
    func wrongIssuer() async throws {
        let error = try await rs256Failure(idClaims { $0["iss"] = "https://evil.example" })
        #expect(error?.check == "iss")
    }

    @Test("alg none")
    func algNone() async throws {
        let endpoint = try JWKSEndpoint([try TestKey.makeRSA(kid: "rsa-1")])
        let cache = await endpoint.cache()
        let token = Base64URL.encode(json(["alg": "none", "typ": "JWT"])) + "." + Base64URL.encode(json(idClaims())) + "."
        let error = await joseFailure { _ = try await IDTokenValidator.validate(token, expecting: expecting(), keys: cache, hmacSecret: nil) }
        #expect(error?.check == "alg")
        #expect(await endpoint.fetches == 0)
    }

    @Test("HS256 token keyed with the RSA public key, checked with RS256 pinned")
    func hs256WithThePublicKeyAsSecret() async throws {
        let key = try TestKey.makeRSA(kid: "rsa-1")
        let cache = try await JWKSEndpoint([key]).cache()
        guard case .rsa(_, let rsa) = key else { return }
        let secrets = [Data(rsa.publicKey.pemRepresentation.utf8), json(try key.jwk())]
        for secret in secrets {
            let token = mintHS256(idClaims(), secret: secret, kid: key.kid)
            let error = await joseFailure { _ = try await IDTokenValidator.validate(token, expecting: expecting(), keys: cache, hmacSecret: nil) }
            #expect(error?.check == "alg")
        }
    }

    @Test("expired beyond the leeway")
    func expired() async throws {
        let error = try await rs256Failure(idClaims { $0["exp"] = Int(Date().timeIntervalSince1970) - 60 },
                                           expecting: expecting(leeway: .seconds(30)))
        #expect(error?.check == "exp")
    }

    @Test("iat in the future beyond the leeway")
    func issuedInTheFuture() async throws {
        let error = try await rs256Failure(idClaims { $0["iat"] = Int(Date().timeIntervalSince1970) + 120 },
                                           expecting: expecting(leeway: .seconds(30)))
        #expect(error?.check == "iat")
    }

    @Test("acr other than the one requested")
    func acrMismatch() async throws {
        let error = try await rs256Failure(idClaims { $0["acr"] = "eidas2" }, expecting: expecting(acr: "eidas1"))
        #expect(error?.check == "acr")
    }

    @Test("at_hash of another access token")
    func atHashMismatch() async throws {
        let error = try await rs256Failure(idClaims { $0["at_hash"] = IDTokenValidator.accessTokenHash("another-access-token") },
                                           expecting: expecting(accessToken: "the-access-token"))
        #expect(error?.check == "at_hash")
    }

    // MARK: key set

    @Test("unknown kid: one refetch, then refused; a second forged kid right after fetches nothing")
    func unknownKid() async throws {
        let key = TestKey.makeEC(kid: "ec-1")
        let endpoint = try JWKSEndpoint([key])
        // The throttle runs from the last unknown-kid refetch, not from the first fetch: the
        // forged kid right after the first fetch still gets its one refetch.
        let cache = await endpoint.cache(refetchInterval: .seconds(30))
        _ = try await IDTokenValidator.validate(try await mint(idClaims(), key: key), expecting: expecting(.es256), keys: cache, hmacSecret: nil)
        #expect(await endpoint.fetches == 1)

        let forged = try await mint(idClaims(), key: TestKey.makeEC(kid: "forged-1"))
        let error = await joseFailure { _ = try await IDTokenValidator.validate(forged, expecting: expecting(.es256), keys: cache, hmacSecret: nil) }
        #expect(error?.check == "kid")
        #expect(error?.unavailable == false)
        #expect(await endpoint.fetches == 2)

        let again = try await mint(idClaims(), key: TestKey.makeEC(kid: "forged-2"))
        let second = await joseFailure { _ = try await IDTokenValidator.validate(again, expecting: expecting(.es256), keys: cache, hmacSecret: nil) }
        #expect(second?.check == "kid")
        #expect(await endpoint.fetches == 2)
        #expect(await cache.fetches == 2)
    }

    @Test("a key set fetch that waited out a timeout is not repeated; one that failed quickly is, once")
    func keySetRetries() async throws {
        for (failure, fetches) in [(HTTPClientError.connectTimeout, 1), (.deadlineExceeded, 1), (.remoteConnectionClosed, 2)] {
            let cache = JWKSCache(url: "https://op.example/api/v2/jwks", retryBackoff: .milliseconds(1), fetch: { _ in throw failure })
            await #expect(throws: JOSEError.self) { _ = try await cache.lookup(keyID: "k", algorithm: .es256) }
            #expect(await cache.fetches == fetches, "\(failure)")
        }
    }

    @Test("a key published after the first fetch is picked up by the one refetch")
    func rotatedKey() async throws {
        let old = TestKey.makeEC(kid: "ec-old")
        let new = TestKey.makeEC(kid: "ec-new")
        let endpoint = try JWKSEndpoint([old])
        let cache = await endpoint.cache(refetchInterval: .seconds(30))
        _ = try await IDTokenValidator.validate(try await mint(idClaims(), key: old), expecting: expecting(.es256), keys: cache, hmacSecret: nil)
        try await endpoint.publish([new, old])
        let validated = try await IDTokenValidator.validate(try await mint(idClaims(), key: new), expecting: expecting(.es256),
                                                            keys: cache, hmacSecret: nil)
        #expect(validated.subject == "alice")
        #expect(await endpoint.fetches == 2)
    }

    @Test("JWKS endpoint answering 500: unavailable, after one retry")
    func keySetUnavailable() async throws {
        let key = try TestKey.makeRSA(kid: "rsa-1")
        let endpoint = try JWKSEndpoint([key])
        await endpoint.answer(status: 500)
        let cache = await endpoint.cache()
        let token = try await mint(idClaims(), key: key)
        let error = await joseFailure { _ = try await IDTokenValidator.validate(token, expecting: expecting(), keys: cache, hmacSecret: nil) }
        #expect(error?.unavailable == true)
        #expect(await endpoint.fetches == 2)
    }

    // MARK: userinfo

    @Test("userinfo JWT with a bad signature")
    func userinfoBadSignature() async throws {
        let key = TestKey.makeEC(kid: "ec-1")
        let cache = try await JWKSEndpoint([key]).cache()
        // Signed by another key under the published kid.
        let impostor = TestKey.makeEC(kid: "ec-1")
        let body = try await mint(["sub": "alice", "iss": issuer, "aud": clientID, "given_name": "Angela"], key: impostor)
        let error = await joseFailure {
            _ = try await UserinfoVerifier.verify(body: Data(body.utf8), contentType: "application/jwt", expectedSubject: "alice",
                                                  algorithm: .es256, issuer: issuer, clientID: clientID, keys: cache, hmacSecret: nil)
        }
        #expect(error?.check == "userinfo signature")
    }

    @Test("userinfo JWT verified: its payload bytes are the claims")
    func userinfoJWTPayload() async throws {
        let key = TestKey.makeEC(kid: "ec-1")
        let cache = try await JWKSEndpoint([key]).cache()
        let claims: [String: Any] = ["sub": "alice", "iss": issuer, "aud": clientID, "birthdate": "1962-08-24"]
        let body = try await mint(claims, key: key)
        let verified = try await UserinfoVerifier.verify(body: Data(body.utf8), contentType: "application/jwt; charset=utf-8",
                                                         expectedSubject: "alice", algorithm: .es256, issuer: issuer,
                                                         clientID: clientID, keys: cache, hmacSecret: nil)
        #expect(verified == json(claims))
    }

    @Test("userinfo sub other than the ID token's")
    func userinfoSubMismatch() async throws {
        let body = Data(#"{"sub":"mallory","given_name":"Angela"}"#.utf8)
        let error = await joseFailure {
            _ = try await UserinfoVerifier.verify(body: body, contentType: "application/json", expectedSubject: "alice",
                                                  algorithm: .rs256, issuer: issuer, clientID: clientID, keys: nil, hmacSecret: nil)
        }
        #expect(error?.check == "userinfo sub")
    }

    @Test("userinfo JSON passes through byte-identical")
    func userinfoJSONVerbatim() async throws {
        let body = Data("""
        { "sub" : "alice",  "given_name":"Angela Claire Louise", "family_name":"DUBOIS",
          "birthdate":"1962-08-24", "gender":"female", "birthplace":"75107", "birthcountry":"99100",
          "preferred_username": "Dubois\\u00e9", "email":"wossewodda-3728@yopmail.com" }

        """.utf8)
        let verified = try await UserinfoVerifier.verify(body: body, contentType: "application/json;charset=UTF-8",
                                                         expectedSubject: "alice", algorithm: .es256, issuer: issuer,
                                                         clientID: clientID, keys: nil, hmacSecret: nil)
        #expect(verified == body)
    }
}
