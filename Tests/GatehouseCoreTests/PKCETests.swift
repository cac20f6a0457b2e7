import GatehouseCore
import Testing

struct PKCETests {
    @Test func rfc7636AppendixBVectorGivesItsChallenge() {
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
        #expect(PKCE.challenge(for: verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        #expect(PKCE.verify(codeVerifier: verifier, codeChallenge: "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"))
    }

    @Test func wrongVerifierDoesNotMatch() {
        let challenge = PKCE.challenge(for: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
        #expect(!PKCE.verify(codeVerifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXK", codeChallenge: challenge))
    }

    @Test(arguments: [
        ("", false),
        (String(repeating: "a", count: 42), false),
        (String(repeating: "a", count: 43), true),
        (String(repeating: "a", count: 128), true),
        (String(repeating: "a", count: 129), false),
        (String(repeating: "a", count: 42) + "+", false),
        (String(repeating: "a", count: 42) + "~", true),
        (String(repeating: "é", count: 43), false),
    ])
    func verifierShapeFollowsRFC7636Section4_1(verifier: String, wellFormed: Bool) {
        #expect(PKCE.isWellFormedVerifier(verifier) == wellFormed)
    }

    @Test func plainChallengeOfTheVerifierItselfIsNotAnS256Challenge() {
        // A "plain" challenge is the verifier; it must not verify as S256.
        let verifier = SecureToken.generate()
        #expect(!PKCE.verify(codeVerifier: verifier, codeChallenge: verifier))
    }

    @Test func generatedTokensCarry256BitsAndAreDistinct() {
        let tokens = (0..<100).map { _ in SecureToken.generate() }
        #expect(Set(tokens).count == 100)
        #expect(tokens.allSatisfy { Base64URL.decode($0)?.count == 32 })
    }
}
