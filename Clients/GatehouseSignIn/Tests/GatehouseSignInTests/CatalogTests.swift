import Crypto
import Foundation
import GatehouseSignIn
import Testing

@Suite("The error catalog, PKCE and what is never printed")
struct CatalogTests {
    static let catalog: [(String, SignInError, Bool)] = [
        ("incorrect_password", .incorrectPassword, true),
        ("invalid_unblock_code", .invalidUnblockCode, true),
        ("invalid_totp_code", .invalidTotpCode, true),
        ("invalid_email_code", .invalidEmailCode, true),
        ("invalid_email_address", .invalidEmailAddress, true),
        ("too_many_requests", .tooManyRequests(retryAfter: 7), true),
        ("failed_to_send_email", .failedToSendEmail, true),
        ("server_unavailable", .serverUnavailable, true),
        ("request_timeout", .requestTimeout, true),
        ("authentication_failure", .authenticationFailure, false),
        ("account_refused", .accountRefused(reason: nil), false),
    ]

    @Test(arguments: catalog)
    func eachFailureCodeHasItsCase(code: String, error: SignInError, canRetry: Bool) {
        #expect(SignInError(failure: code, retryAfter: 7) == error)
        #expect(error.code == code)
        #expect(error.canRetry == canRetry)
        #expect(String(describing: error).hasPrefix(code))
    }

    @Test func anAccountRefusalCarriesItsReason() {
        #expect(SignInError(failure: "account_refused", reason: "password_leaked") == .accountRefused(reason: "password_leaked"))
        #expect(String(describing: SignInError.accountRefused(reason: "blocked")).contains("(blocked)"))
    }

    @Test func theClientsOwnErrors() {
        #expect(SignInError.invalidSession.code == "invalid_session")
        #expect(!SignInError.invalidSession.canRetry)
        #expect(SignInError.network.code == "network")
        #expect(SignInError.network.canRetry)
        #expect(SignInError.invalidState.code == "invalid_state")
        #expect(SignInError.unexpected("x").code == "unexpected")
        #expect(SignInError(failure: "something_new") == .unexpected("something_new"))
        #expect(SignInError.tooManyRequests(retryAfter: 3).retryAfter == 3)
    }

    @Test func pkceVerifierAndChallenge() {
        // RFC 7636 Appendix B.
        #expect(PKCE(verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk").challenge == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        let pkce = PKCE()
        #expect(pkce.verifier.count == 43)
        #expect(pkce.verifier.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") })
        #expect(base64URLDecode(pkce.verifier)?.count == 32)
        #expect(PKCE().verifier != pkce.verifier)
        #expect(!String(describing: pkce).contains(pkce.verifier))
    }

    @Test func noTokenInTheDescriptionOfTheFinalState() async throws {
        let (client, transport, _) = try await Fixture.signingInClient(password: "pw-secret")
        transport.script(Fixture.code(), Fixture.tokens())
        let state = try await client.signIn()
        guard case .finalize(let tokens) = state else {
            Issue.record("not finalized")
            return
        }
        for text in [String(describing: state), String(describing: tokens), String(reflecting: tokens)] {
            #expect(!text.contains("gha_secret_access"))
            #expect(!text.contains("ghr_secret_refresh"))
        }
        #expect(String(describing: state) == "finalize")
    }

    @Test func noSecretInAnErrorsDescription() async throws {
        let (client, transport, _) = try await Fixture.signingInClient(password: "pw-secret")
        transport.script(.json(400, ["error": "invalid_request", "error_description": "pw-secret s1",
                                     "auth_session": "s-secret-2"]))
        try await client.signIn()
        let error = try #require(await client.lastError)
        for text in [String(describing: error), String(reflecting: error), error.code] {
            #expect(!text.contains("pw-secret"))
            #expect(!text.contains("s-secret-2"))
            #expect(!text.contains("s1"))
        }
    }

    @Test func emailAddressValidation() {
        #expect(InAppSignIn.validateEmailAddress("user@example.com"))
        #expect(!InAppSignIn.validateEmailAddress("user@example"))
        #expect(!InAppSignIn.validateEmailAddress("user example@example.com"))
        #expect(!InAppSignIn.validateEmailAddress("@example.com"))
        #expect(!InAppSignIn.validateEmailAddress("a@b@example.com"))
    }
}
