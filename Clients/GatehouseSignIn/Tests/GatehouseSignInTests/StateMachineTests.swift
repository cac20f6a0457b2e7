import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import GatehouseSignIn
import Testing

@Suite("The seed's state machine over the challenge endpoint")
struct StateMachineTests {
    // MARK: - start()

    @Test func startReadsTheMetadataAndGoesToStart() async throws {
        let (client, transport, recorder) = try Fixture.client(Fixture.metadata())
        #expect(await client.state == .initializing)
        let state = try await client.start()
        #expect(state == .start)
        #expect(await client.state == .start)
        #expect(await client.lastError == nil)
        #expect(recorder.names == ["start"])
        let request = try #require(transport.requests.first)
        #expect(transport.requests.count == 1)
        #expect(request.url?.absoluteString == "https://gatehouse.example/.well-known/oauth-authorization-server")
        #expect((request.httpMethod ?? "GET") == "GET")
    }

    @Test func startWithoutAChallengeEndpointFallsBackToTheBrowserWithPKCE() async throws {
        let (client, transport, recorder) = try Fixture.client(Fixture.metadata(challenge: false), redirectURI: Fixture.redirect)
        let state = try await client.start()
        guard case .fallbackInBrowser(let url) = state else {
            Issue.record("not a fallback: \(state)")
            return
        }
        #expect(recorder.names == ["fallbackInBrowser"])
        #expect(transport.requests.count == 1)
        #expect(url.withoutQuery == Fixture.authorizationEndpoint)
        let query = url.queryFields
        #expect(query["response_type"] == "code")
        #expect(query["client_id"] == Fixture.clientID)
        #expect(query["redirect_uri"] == Fixture.redirect.absoluteString)
        #expect(query["scope"] == "read write")
        #expect(query["code_challenge_method"] == "S256")
        let browser = try #require(await client.browserSignIn)
        #expect(browser.url == url)
        #expect(query["state"] == browser.state)
        #expect(query["code_challenge"] == base64URLEncode(SHA256.hash(data: Data(browser.codeVerifier.utf8))))
    }

    @Test func startWithoutNetworkStaysInitializingAndMayBeCalledAgain() async throws {
        let (client, _, _) = try Fixture.client(.noConnection, Fixture.metadata())
        #expect(try await client.start() == .initializing)
        #expect(await client.lastError == .network)
        #expect(try await client.start() == .start)
        #expect(await client.lastError == nil)
    }

    @Test func startRefusesAnInsecureChallengeEndpoint() async throws {
        let metadata = Reply.json(200, ["authorization_challenge_endpoint": "http://gatehouse.example/oauth/authorize-challenge",
                                        "token_endpoint": Fixture.tokenEndpoint])
        let (client, _, _) = try Fixture.client(metadata)
        #expect(try await client.start() == .initializing)
        guard case .unexpected = await client.lastError else {
            Issue.record("an http endpoint on a public host was accepted")
            return
        }
    }

    @Test func theIssuerMustBeHTTPSOrLoopback() throws {
        #expect(throws: SignInError.self) { try InAppSignIn(issuer: URL(string: "http://gatehouse.example")!, clientID: "a") }
        #expect(throws: SignInError.self) { try InAppSignIn(issuer: URL(string: "http://127.0.0.1.example.com")!, clientID: "a") }
        _ = try InAppSignIn(issuer: URL(string: "http://127.0.0.1:8080")!, clientID: "a")
        _ = try InAppSignIn(issuer: URL(string: "http://localhost:8080")!, clientID: "a")
        _ = try InAppSignIn(issuer: URL(string: "http://[::1]:8080")!, clientID: "a")
        _ = try InAppSignIn(issuer: URL(string: "https://gatehouse.example")!, clientID: "a")
    }

    // MARK: - checkAccount(_:)

    @Test func checkAccountSendsTheAuthorizationRequest() async throws {
        let (client, transport, recorder) = try Fixture.client(Fixture.metadata(), Fixture.step("password", session: "s1"),
                                                               redirectURI: Fixture.redirect)
        try await client.start()
        recorder.clear()
        #expect(try await client.checkAccount("user@example.com") == .signIn)
        #expect(recorder.names == ["checkingAccount", "signIn"])
        #expect(await client.lastError == nil)
        let request = transport.requests[1]
        #expect(request.url?.absoluteString == Fixture.challengeEndpoint)
        #expect(request.httpMethod == "POST")
        #expect(request.value(forHTTPHeaderField: "Content-Type") == "application/x-www-form-urlencoded")
        #expect(request.value(forHTTPHeaderField: "DPoP") == nil)
        let form = request.form
        #expect(form["client_id"] == Fixture.clientID)
        #expect(form["response_type"] == "code")
        #expect(form["code_challenge_method"] == "S256")
        #expect(form["code_challenge"]?.count == 43)
        #expect(form["login_hint"] == "user@example.com")
        #expect(form["scope"] == "read write")
        #expect(form["redirect_uri"] == Fixture.redirect.absoluteString)
        #expect(form["auth_session"] == nil)
        #expect(form["password"] == nil)
    }

    @Test func checkAccountWithoutRedirectURISendsNone() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata(), Fixture.step("email_link", session: "s1"), scope: nil)
        try await client.start()
        #expect(try await client.checkAccount("user@example.com") == .emailVerification)
        let form = transport.requests[1].form
        #expect(form["redirect_uri"] == nil)
        #expect(form["scope"] == nil)
        #expect(form["state"] == nil)
        #expect(Set(form.keys) == ["client_id", "response_type", "code_challenge", "code_challenge_method", "login_hint"])
    }

    @Test func everyDialogueHasAFreshVerifier() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata(), .json(400, ["error": "invalid_session"]),
                                                       Fixture.step("password", session: "s2"))
        try await client.start()
        try await client.checkAccount("a@example.com")
        try await client.checkAccount("a@example.com")
        let first = transport.requests[1].form["code_challenge"]
        let second = transport.requests[2].form["code_challenge"]
        #expect(first != nil && second != nil && first != second)
    }

    @Test func anEmptyAccountSendsNothing() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata())
        try await client.start()
        #expect(try await client.checkAccount("  ") == .start)
        #expect(await client.lastError == .invalidEmailAddress)
        #expect(transport.requests.count == 1)
    }

    @Test(arguments: [("password", SignInState.signIn), ("unblock_code", .unblockCodeNeeded),
                      ("otp", .totpVerificationNeeded), ("email_link", .emailVerification)])
    func eachStepLeadsToItsState(step: String, expected: SignInState) async throws {
        let (client, _, recorder) = try Fixture.client(Fixture.metadata(), Fixture.step(step, session: "s1"))
        try await client.start()
        #expect(try await client.checkAccount("user@example.com") == expected)
        #expect(recorder.names == ["start", "checkingAccount", expected.name])
    }

    @Test func anUnknownStepIsUnexpected() async throws {
        let (client, _, _) = try Fixture.client(Fixture.metadata(), Fixture.step("carrier_pigeon", session: "s1"))
        try await client.start()
        #expect(try await client.checkAccount("user@example.com") == .start)
        guard case .unexpected = await client.lastError else {
            Issue.record("an unknown step was taken")
            return
        }
    }

    @Test func anInvalidEmailAddressStartsOver() async throws {
        let (client, _, _) = try Fixture.client(
            Fixture.metadata(), .json(400, ["error": "invalid_request", "failure": "invalid_email_address"]))
        try await client.start()
        #expect(try await client.checkAccount("not an address") == .start)
        #expect(await client.lastError == .invalidEmailAddress)
    }

    // MARK: - signIn()

    @Test func signInSendsThePasswordWithTheSession() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient(password: "p&ss=w+rd %é")
        transport.script(Fixture.step("password", session: "s2", failure: "incorrect_password"))
        #expect(try await client.signIn() == .signIn)
        #expect(recorder.names == ["signingIn", "signIn"])
        #expect(recorder.errors.last == .incorrectPassword)
        #expect(await client.lastError == .incorrectPassword)
        let form = try #require(transport.requests.last).form
        #expect(form == ["auth_session": "s1", "password": "p&ss=w+rd %é"])
    }

    @Test func theAuthSessionIsReplacedByEveryAnswerThatCarriesOne() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(Fixture.step("password", session: "s2", failure: "incorrect_password"),
                         .json(429, ["error": "temporarily_unavailable", "failure": "too_many_requests", "retry_after": 1]),
                         .json(503, ["error": "temporarily_unavailable", "failure": "server_unavailable", "auth_session": "s3"]),
                         .noConnection,
                         Fixture.step("otp", session: "s4"))
        try await client.signIn()
        // A refused password is dropped: it is not sent again until the user types one.
        await #expect(throws: SignInError.invalidState) { try await client.signIn() }
        try await client.setPassword("typed again")
        try await client.signIn()
        try await client.signIn()
        try await client.signIn()
        #expect(await client.lastError == .network)
        #expect(try await client.signIn() == .totpVerificationNeeded)
        let sessions = transport.requests.suffix(5).map { $0.form["auth_session"] }
        // s1 answered s2; the 429 carried none (s2 stays); the 503 carried s3; no answer keeps s3.
        #expect(sessions == ["s1", "s2", "s2", "s3", "s3"])
        transport.script(Fixture.step("otp", session: "s5", failure: "invalid_totp_code"))
        try await client.verifySessionTotpCode("000000")
        #expect(transport.requests.last?.form["auth_session"] == "s4")
    }

    @Test func anAnswerThatEndsTheDialogueGoesBackToStart() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(.json(429, ["error": "temporarily_unavailable", "failure": "too_many_requests", "retry_after": 30,
                                     "dialogue_ended": true]))
        #expect(try await client.signIn() == .start)
        #expect(await client.lastError == .tooManyRequests(retryAfter: 30))
        // Nothing of the old dialogue is sent again: a new checkAccount begins another, without auth_session.
        transport.script(Fixture.step("password", session: "fresh"))
        try await client.checkAccount("user@example.com")
        #expect(transport.requests.last?.form["auth_session"] == nil)
        #expect(transport.requests.last?.form["response_type"] == "code")
    }

    @Test func signInWithoutAPasswordSendsNothing() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata(), Fixture.step("password", session: "s1"))
        try await client.start()
        try await client.checkAccount("user@example.com")
        await #expect(throws: SignInError.invalidState) { try await client.signIn() }
        #expect(transport.requests.count == 2)
        #expect(await client.state == .signIn)
    }

    @Test func signInToUnblockCodeThenTheCodeCarriesThePassword() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient(password: "hunter2")
        transport.script(Fixture.step("unblock_code", session: "s2"))
        #expect(try await client.signIn() == .unblockCodeNeeded)
        transport.script(Fixture.step("unblock_code", session: "s3", failure: "invalid_unblock_code"))
        #expect(try await client.verifyUnblockCode("123 456") == .unblockCodeNeeded)
        #expect(await client.lastError == .invalidUnblockCode)
        #expect(transport.requests.last?.form == ["auth_session": "s2", "unblock_code": "123456", "password": "hunter2"])
        transport.script(Fixture.step("unblock_code", session: "s4"))
        #expect(try await client.resendUnblockCodeEmail() == .unblockCodeNeeded)
        #expect(await client.lastError == nil)
        #expect(transport.requests.last?.form == ["auth_session": "s3", "resend": "unblock_code"])
        transport.script(Fixture.code(), Fixture.tokens())
        guard case .finalize = try await client.verifyUnblockCode("654321") else {
            Issue.record("not finalized")
            return
        }
        #expect(recorder.names == ["signingIn", "unblockCodeNeeded", "verifyingUnblockCode", "unblockCodeNeeded",
                                   "unblockCodeNeeded", "verifyingUnblockCode", "finalize"])
    }

    @Test func thePasswordMayBeTypedWithTheUnblockCode() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata(), Fixture.step("unblock_code", session: "s1"))
        try await client.start()
        try await client.checkAccount("user@example.com")
        await #expect(throws: SignInError.invalidState) { try await client.verifyUnblockCode("123456") }
        try await client.setPassword("typed again")
        transport.script(Fixture.step("otp", session: "s2"))
        #expect(try await client.verifyUnblockCode("123456") == .totpVerificationNeeded)
        #expect(transport.requests.last?.form["password"] == "typed again")
    }

    @Test func totpStep() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(Fixture.step("otp", session: "s2"), Fixture.step("otp", session: "s3", failure: "invalid_totp_code"))
        try await client.signIn()
        #expect(try await client.verifySessionTotpCode("111111") == .totpVerificationNeeded)
        #expect(await client.lastError == .invalidTotpCode)
        #expect(transport.requests.last?.form == ["auth_session": "s2", "otp": "111111"])
        #expect(recorder.names == ["signingIn", "totpVerificationNeeded", "verifyingSessionTotpCode", "totpVerificationNeeded"])
    }

    @Test func emailStep() async throws {
        let (client, transport, recorder) = try Fixture.client(Fixture.metadata(), Fixture.step("email_link", session: "s1"))
        try await client.start()
        #expect(try await client.checkAccount("user@example.com") == .emailVerification)
        transport.script(Fixture.step("email_link", session: "s2"),
                         Fixture.step("email_link", session: "s3", failure: "invalid_email_code"),
                         Fixture.code(), Fixture.tokens())
        #expect(try await client.resendVerificationSessionCodeEmail() == .emailVerification)
        #expect(transport.requests.last?.form == ["auth_session": "s1", "resend": "email_link"])
        #expect(try await client.verifySessionEmailCode("bad") == .emailVerification)
        #expect(await client.lastError == .invalidEmailCode)
        #expect(transport.requests.last?.form == ["auth_session": "s2", "email_code": "bad"])
        recorder.clear()
        guard case .finalize(let tokens) = try await client.verifySessionEmailCode("good") else {
            Issue.record("not finalized")
            return
        }
        #expect(tokens.accessToken == "gha_secret_access")
        #expect(recorder.names == ["verifyingSessionEmailCode", "finalize"])
        #expect(transport.requests[transport.requests.count - 2].form == ["auth_session": "s3", "email_code": "good"])
    }

    // MARK: - 200: the token exchange

    @Test func anAuthorizationCodeIsRedeemedWithTheVerifierAndNoRedirectURI() async throws {
        let (client, transport, recorder) = try Fixture.client(
            Fixture.metadata(), Fixture.step("password", session: "s1"), Fixture.code("ghc_the_code"), Fixture.tokens(),
            redirectURI: Fixture.redirect)
        try await client.start()
        try await client.checkAccount("user@example.com")
        try await client.setPassword("pw")
        recorder.clear()
        let state = try await client.signIn()
        guard case .finalize(let tokens) = state else {
            Issue.record("not finalized: \(state)")
            return
        }
        #expect(recorder.names == ["signingIn", "finalize"])
        #expect(await client.lastError == nil)
        #expect(tokens.accessToken == "gha_secret_access")
        #expect(tokens.tokenType == "Bearer")
        #expect(tokens.expiresIn == 3600)
        #expect(tokens.refreshToken == "ghr_secret_refresh")
        #expect(tokens.scope == "read write")
        #expect(tokens.idToken == nil)
        #expect(tokens.raw["expires_in"] == .int(3600))
        let token = try #require(transport.requests.last)
        #expect(token.url?.absoluteString == Fixture.tokenEndpoint)
        #expect(token.httpMethod == "POST")
        let form = token.form
        #expect(Set(form.keys) == ["grant_type", "code", "client_id", "code_verifier"])
        #expect(form["grant_type"] == "authorization_code")
        #expect(form["code"] == "ghc_the_code")
        #expect(form["client_id"] == Fixture.clientID)
        #expect(form["redirect_uri"] == nil)
        let verifier = try #require(form["code_verifier"])
        #expect(verifier.count == 43)
        let challenge = try #require(transport.requests[1].form["code_challenge"])
        #expect(base64URLEncode(SHA256.hash(data: Data(verifier.utf8))) == challenge)
        // The dialogue is over: nothing more may be called.
        await #expect(throws: SignInError.invalidState) { try await client.signIn() }
    }

    @Test(arguments: [Reply.json(400, ["error": "invalid_grant"]), .noConnection, .json(200, ["token_type": "Bearer"])])
    func aFailedTokenExchangeIsAnAuthenticationFailure(answer: Reply) async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(Fixture.code(), answer)
        #expect(try await client.signIn() == .start)
        #expect(await client.lastError == .authenticationFailure)
        #expect(recorder.names == ["signingIn", "start"])
        #expect(transport.requests.last?.url?.absoluteString == Fixture.tokenEndpoint)
    }

    // MARK: - redirect_to_web

    @Test func redirectToWebWithARequestURI() async throws {
        let (client, transport, _) = try Fixture.client(
            Fixture.metadata(),
            .json(403, ["error": "redirect_to_web", "request_uri": "urn:ietf:params:oauth:request_uri:a+b/c", "expires_in": 600]),
            redirectURI: Fixture.redirect)
        try await client.start()
        let state = try await client.checkAccount("user@example.com")
        guard case .fallbackInBrowser(let url) = state else {
            Issue.record("not a fallback: \(state)")
            return
        }
        #expect(url.withoutQuery == Fixture.authorizationEndpoint)
        #expect(url.queryFields == ["client_id": Fixture.clientID, "request_uri": "urn:ietf:params:oauth:request_uri:a+b/c"])
        #expect(url.query?.contains("%2B") == true, "a + in the request_uri must be escaped")
        let browser = try #require(await client.browserSignIn)
        // The pushed request holds the first request's challenge: the browser code is redeemed with its verifier.
        let challenge = try #require(transport.requests[1].form["code_challenge"])
        #expect(base64URLEncode(SHA256.hash(data: Data(browser.codeVerifier.utf8))) == challenge)
        #expect(browser.state == transport.requests[1].form["state"])
        #expect(browser.redirectURI == Fixture.redirect)
    }

    @Test func redirectToWebWithoutARequestURI() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(.json(403, ["error": "redirect_to_web"]))
        let state = try await client.signIn()
        guard case .fallbackInBrowser(let url) = state else {
            Issue.record("not a fallback: \(state)")
            return
        }
        #expect(url.withoutQuery == Fixture.authorizationEndpoint)
        let query = url.queryFields
        #expect(query["response_type"] == "code")
        #expect(query["client_id"] == Fixture.clientID)
        #expect(query["scope"] == "read write")
        #expect(query["code_challenge_method"] == "S256")
        #expect(query["request_uri"] == nil)
        let browser = try #require(await client.browserSignIn)
        #expect(query["state"] == browser.state && browser.state != nil)
        #expect(query["code_challenge"] == base64URLEncode(SHA256.hash(data: Data(browser.codeVerifier.utf8))))
        // A fresh verifier, not the dialogue's.
        #expect(query["code_challenge"] != transport.requests[1].form["code_challenge"])
    }

    // MARK: - Errors that keep or end the dialogue

    @Test func anInvalidSessionGoesBackToStart() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(.json(400, ["error": "invalid_session"]), Fixture.step("password", session: "n1"))
        #expect(try await client.signIn() == .start)
        #expect(await client.lastError == .invalidSession)
        #expect(recorder.names == ["signingIn", "start"])
        // A new dialogue: no old auth_session, and the password is forgotten.
        try await client.checkAccount("user@example.com")
        #expect(transport.requests.last?.form["auth_session"] == nil)
        await #expect(throws: SignInError.invalidState) { try await client.signIn() }
    }

    @Test func tooManyRequestsStaysWithTheBodysRetryAfter() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(.json(429, ["error": "temporarily_unavailable", "failure": "too_many_requests", "retry_after": 30],
                               headers: ["Retry-After": "99"]))
        #expect(try await client.signIn() == .signIn)
        #expect(await client.lastError == .tooManyRequests(retryAfter: 30))
        #expect(recorder.names == ["signingIn", "signIn"])
    }

    @Test func tooManyRequestsTakesTheRetryAfterHeader() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(Fixture.step("unblock_code", session: "s2"),
                         .json(429, ["error": "temporarily_unavailable"], headers: ["Retry-After": "12"]))
        try await client.signIn()
        #expect(try await client.verifyUnblockCode("123456") == .unblockCodeNeeded)
        #expect(await client.lastError == .tooManyRequests(retryAfter: 12))
        #expect(await client.lastError?.retryAfter == 12)
    }

    @Test(arguments: [(503, "failed_to_send_email", SignInError.failedToSendEmail), (503, "server_unavailable", .serverUnavailable),
                      (504, "request_timeout", .requestTimeout), (502, "authentication_failure", .authenticationFailure)])
    func upstreamFailuresStayInTheStep(status: Int, failure: String, expected: SignInError) async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(Fixture.step("unblock_code", session: "s2"),
                         .json(status, ["error": "server_error", "failure": failure, "auth_session": "s3"]),
                         Fixture.step("unblock_code", session: "s4"))
        try await client.signIn()
        #expect(try await client.resendUnblockCodeEmail() == .unblockCodeNeeded)
        #expect(await client.lastError == expected)
        #expect(recorder.errors.last == expected)
        try await client.resendUnblockCodeEmail()
        #expect(transport.requests.last?.form["auth_session"] == "s3")
    }

    @Test func noAnswerIsANetworkErrorInTheSameStep() async throws {
        let (client, transport, recorder) = try await Fixture.signingInClient()
        transport.script(Fixture.step("otp", session: "s2"), .noConnection)
        try await client.signIn()
        #expect(try await client.verifySessionTotpCode("123456") == .totpVerificationNeeded)
        #expect(await client.lastError == .network)
        #expect(recorder.names == ["signingIn", "totpVerificationNeeded", "verifyingSessionTotpCode", "totpVerificationNeeded"])
    }

    @Test func otherErrorsAreUnexpected() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        transport.script(.json(400, ["error": "invalid_request", "error_description": "password: hunter2"]))
        #expect(try await client.signIn() == .signIn)
        #expect(await client.lastError == .unexpected("invalid_request"))
    }

    // MARK: - Calls in the wrong state

    @Test func callsInTheWrongStateThrowAndSendNothing() async throws {
        let (client, transport, recorder) = try Fixture.client()
        await #expect(throws: SignInError.invalidState) { try await client.checkAccount("user@example.com") }
        await #expect(throws: SignInError.invalidState) { try await client.setPassword("pw") }
        await #expect(throws: SignInError.invalidState) { try await client.signIn() }
        await #expect(throws: SignInError.invalidState) { try await client.verifyUnblockCode("123456") }
        await #expect(throws: SignInError.invalidState) { try await client.resendUnblockCodeEmail() }
        await #expect(throws: SignInError.invalidState) { try await client.verifySessionTotpCode("123456") }
        await #expect(throws: SignInError.invalidState) { try await client.verifySessionEmailCode("code") }
        await #expect(throws: SignInError.invalidState) { try await client.resendVerificationSessionCodeEmail() }
        await #expect(throws: SignInError.invalidState) { try await client.reset() }
        #expect(transport.requests.isEmpty)
        #expect(recorder.states.isEmpty)
        #expect(await client.state == .initializing)

        transport.script(Fixture.metadata(), Fixture.step("password", session: "s1"))
        try await client.start()
        await #expect(throws: SignInError.invalidState) { try await client.start() }
        await #expect(throws: SignInError.invalidState) { try await client.setPassword("pw") }
        try await client.checkAccount("user@example.com")
        try await client.setPassword("pw")
        let sent = transport.requests.count
        await #expect(throws: SignInError.invalidState) { try await client.checkAccount("user@example.com") }
        await #expect(throws: SignInError.invalidState) { try await client.verifyUnblockCode("123456") }
        await #expect(throws: SignInError.invalidState) { try await client.resendUnblockCodeEmail() }
        await #expect(throws: SignInError.invalidState) { try await client.verifySessionTotpCode("123456") }
        await #expect(throws: SignInError.invalidState) { try await client.verifySessionEmailCode("code") }
        await #expect(throws: SignInError.invalidState) { try await client.resendVerificationSessionCodeEmail() }
        #expect(transport.requests.count == sent)
        #expect(await client.state == .signIn)
    }

    @Test func nothingMayBeCalledWhileARequestIsUnderWay() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        var slow = Fixture.step("unblock_code", session: "s2")
        slow.delay = .milliseconds(300)
        transport.script(Fixture.step("unblock_code", session: "s2"), slow)
        try await client.signIn()
        try await client.setPassword("pw")
        // A resend has no transient state of its own: the client is still in unblockCodeNeeded.
        let resend = Task { try await client.resendUnblockCodeEmail() }
        while transport.requests.count < 4 { try await Task.sleep(for: .milliseconds(5)) }
        #expect(await client.state == .unblockCodeNeeded)
        await #expect(throws: SignInError.invalidState) { try await client.verifyUnblockCode("123456") }
        await #expect(throws: SignInError.invalidState) { try await client.resendUnblockCodeEmail() }
        #expect(try await resend.value == .unblockCodeNeeded)
        #expect(transport.requests.count == 4)
    }

    @Test func resetStartsOverWithoutARequest() async throws {
        let (client, transport, _) = try await Fixture.signingInClient()
        #expect(try await client.reset() == .start)
        #expect(transport.requests.count == 2)
        transport.script(Fixture.step("password", session: "t1"))
        try await client.checkAccount("other@example.com")
        #expect(transport.requests.last?.form["auth_session"] == nil)
        #expect(transport.requests.last?.form["login_hint"] == "other@example.com")
    }

    // MARK: - Observers

    @Test func theStreamSeesEveryState() async throws {
        let (client, transport, _) = try Fixture.client(Fixture.metadata(), Fixture.step("password", session: "s1"))
        transport.script(Fixture.step("otp", session: "s2"), Fixture.code(), Fixture.tokens())
        try await client.start()
        try await client.checkAccount("user@example.com")
        try await client.setPassword("pw")
        try await client.signIn()
        try await client.verifySessionTotpCode("123456")
        var names: [String] = []
        for await state in client.stateUpdates {
            names.append(state.name)
            if state.isFinal { break }
        }
        #expect(names == ["start", "checkingAccount", "signIn", "signingIn", "totpVerificationNeeded",
                          "verifyingSessionTotpCode", "finalize"])
    }
}
