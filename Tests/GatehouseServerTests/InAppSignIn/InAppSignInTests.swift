import AsyncHTTPClient
import Crypto
import Foundation
import GatehouseCore
@testable import GatehouseServer
import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Synchronization
import Testing

/// The steps an upstream offers, scripted: each call takes the next outcome and is recorded, so
/// a test sees exactly what reached the upstream (the end-to-end suite does the same against
/// django-oauth-toolkit, an Auth0 double and the central double).
final class ScriptedSteps: InAppSignInSteps {
    let firstStep: InAppFirstStep
    private let outcomes = Mutex<[InAppOutcome]>([])
    private let log = Mutex<[String]>([])

    init(firstStep: InAppFirstStep) { self.firstStep = firstStep }

    var calls: [String] { log.withLock { $0 } }
    func then(_ outcome: InAppOutcome) { outcomes.withLock { $0.append(outcome) } }

    private func next(_ call: String) -> InAppOutcome {
        log.withLock { $0.append(call) }
        return outcomes.withLock { $0.isEmpty ? .refused(.unusable("nothing scripted")) : $0.removeFirst() }
    }

    func password(login: String, password: String, scopes: [String], clientAddress: String?) async -> InAppOutcome {
        next("password:\(login):\(password)")
    }
    func secondFactor(token: String, otp: String, clientAddress: String?) async -> InAppOutcome { next("otp:\(token):\(otp)") }
    func sendEmailLink(to email: String, clientAddress: String?) async -> InAppRefusal? {
        log.withLock { $0.append("link:\(email)") }
        return nil
    }
    func emailCode(_ code: String, for email: String) async -> InAppOutcome { next("email:\(code):\(email)") }
}

/// An `oauth2` profile (its authorize URL is the real one) whose in-app steps are scripted.
struct ScriptedStepsUpstream: UpstreamProfile {
    let settings: UpstreamSettings
    let profile: OAuth2Upstream
    let steps: ScriptedSteps?

    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        try await profile.beginAuthorization(start)
    }
    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant { throw .badUpstream("not in these tests") }
    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        throw .badUpstream("not in these tests")
    }
    func revoke(_ token: String, hint: String) async {}
    var inAppSignIn: (any InAppSignInSteps)? { steps }
}

/// Keeps what Gatehouse e-mails.
final class RecordingMailer: Mailer {
    private let sent = Mutex<[MailMessage]>([])
    var messages: [MailMessage] { sent.withLock { $0 } }
    func send(_ message: MailMessage) async throws { sent.withLock { $0.append(message) } }

    /// The 6-digit code of the last message.
    var lastCode: String? {
        guard let body = messages.last?.body else { return nil }
        return body.firstMatch(of: /\b[0-9]{6}\b/).map { String($0.output) }
    }
}

struct DPoPSigner {
    let key = P256.Signing.PrivateKey()
    var jwk: [String: String] {
        let raw = key.publicKey.rawRepresentation
        return ["kty": "EC", "crv": "P-256", "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
    }

    func proof(url: String, now: Date) -> String {
        let header: [String: Any] = ["typ": "dpop+jwt", "alg": "ES256", "jwk": jwk]
        let claims: [String: Any] = ["htm": "POST", "htu": url, "iat": now.timeIntervalSince1970, "jti": SecureToken.generate()]
        let input = Base64URL.encode(try! JSONSerialization.data(withJSONObject: header)) + "."
            + Base64URL.encode(try! JSONSerialization.data(withJSONObject: claims))
        return input + "." + Base64URL.encode(try! key.signature(for: Data(input.utf8)).rawRepresentation)
    }
}

/// The authorization challenge endpoint's dialogue, in process: the draft's answers, the
/// auth_session's single use and binding, the steps in order, the failure catalog, the unblock
/// step counted in the store across instances, and the browser fallback's pushed request.
struct InAppSignInTests {
    static let issuer = "https://gatehouse.example.com"
    static let endpoint = issuer + "/oauth/authorize-challenge"

    static func yaml(extraClient: String = "", inAppSection: String = "") -> String {
        """
        server:
          public_base_url: \(issuer)
        store:
          sqlite_path: ":memory:"
        sessions:
          encryption_keys_file: keys
        upstreams:
          - name: legacy
            kind: oauth2
            client_id: gatehouse
            client_secret_env: SECRET
            authorization_endpoint: https://as.example.com/authorize
            token_endpoint: https://as.example.com/token
            password_grant: true
          - name: web
            kind: oauth2
            client_id: gatehouse
            client_secret_env: SECRET
            authorization_endpoint: https://web.example.com/authorize
            token_endpoint: https://web.example.com/token
        clients:
          - client_id: com.example.inapp
            upstream: legacy
            redirect_uris: ["com.example.inapp:/cb"]
            in_app_sign_in: on
          - client_id: com.example.plain
            upstream: legacy
            redirect_uris: ["com.example.plain:/cb"]
          - client_id: com.example.web
            upstream: web
            redirect_uris: ["com.example.web:/cb"]
            in_app_sign_in: on
        \(extraClient)
        mail:
          smtp_host: 127.0.0.1
          smtp_port: 9
          starttls: false
          timeout: 1s
          from: gatehouse@example.com
        \(inAppSection)
        """
    }

    struct Harness {
        let steps: ScriptedSteps
        let clock: ManualClock
        let gatehouse: Gatehouse
        let store: SQLiteAuthorizationStore
        /// What was e-mailed, when the test hands in a recorder instead of the (closed) relay.
        let mail: RecordingMailer?
    }

    /// A Gatehouse over `yaml` (its mail relay is a closed port: unblock codes cannot be sent), and `body` with a client
    /// of it and, when asked, of a second instance over the same store.
    static func withRouter(yaml: String = yaml(), firstStep: InAppFirstStep = .password, recordingMail: Bool = false,
                           _ body: @Sendable (Harness, any TestClientProtocol, (any TestClientProtocol)?) async throws -> Void,
                           secondInstance: Bool = false) async throws
    {
        let folder = FileManager.default.temporaryDirectory.appending(path: "in-app-" + SecureToken.generate())
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try Data(TestGatehouse.keyRingLine.utf8).write(to: folder.appending(path: "keys"))
        let configuration = try YAMLConfigurationLoader.load(yaml: yaml, baseDirectory: folder, environment: ["SECRET": "upstream-secret"])
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let steps = ScriptedSteps(firstStep: firstStep)
        let clock = ManualClock()
        var profiles: [String: any UpstreamProfile] = [:]
        for (name, settings) in configuration.upstreams {
            profiles[name] = ScriptedStepsUpstream(settings: settings, profile: OAuth2Upstream(settings: settings, httpClient: .shared, logger: logger),
                                                   steps: name == "legacy" ? steps : nil)
        }
        let (upstreams, quiet) = (profiles, logger)
        let mail = recordingMail ? RecordingMailer() : nil
        @Sendable func make() -> Gatehouse {
            let sessions = SessionServices(store: store, settings: configuration.sessions!, logger: quiet, now: { clock.now() })
            if let mail {
                return Gatehouse(configuration: configuration, store: store, upstreams: upstreams, sessions: sessions,
                                 now: { clock.now() }, logger: quiet, mailer: mail)
            }
            return Gatehouse(configuration: configuration, store: store, upstreams: upstreams, sessions: sessions, now: { clock.now() }, logger: quiet)
        }
        let gatehouse = make()
        let harness = Harness(steps: steps, clock: clock, gatehouse: gatehouse, store: store, mail: mail)
        do {
            try await Application(router: GatehouseApplication.router(for: gatehouse)).test(.router) { client in
                if secondInstance {
                    try await Application(router: GatehouseApplication.router(for: make())).test(.router) { other in
                        try await body(harness, client, other)
                    }
                } else {
                    try await body(harness, client, nil)
                }
            }
        } catch {
            try await store.close()
            throw error
        }
        try await store.close()
    }

    static let tokens = Data(#"{"access_token":"upstream-at","token_type":"Bearer","expires_in":3600,"refresh_token":"upstream-rt"}"#.utf8)
    static var signedIn: InAppOutcome { .signedIn(UpstreamGrant(tokens: try! UpstreamTokenResponse(body: tokens))) }

    // MARK: The whole dialogue

    @Test func aPasswordSignInEndsInACodeRedeemedWithoutRedirectURI() async throws {
        try await Self.withRouter { harness, client, _ in
            let first = try await client.challenge(Self.begin())
            #expect(first.status == .forbidden)
            let body = json(first)
            #expect(body["error"] as? String == "insufficient_authorization")
            #expect(body["step"] as? String == "password")
            let session = try #require(body["auth_session"] as? String)
            #expect(session.count >= 43)  // 256 bits
            #expect(first.headers[.cacheControl] == "no-store")
            #expect(harness.steps.calls.isEmpty)  // nothing asked of the upstream for the account

            harness.steps.then(Self.signedIn)
            let done = try await client.challenge(["auth_session": session, "password": "correct horse"])
            #expect(done.status == .ok)
            #expect(harness.steps.calls == ["password:ada@example.com:correct horse"])
            let code = try #require(json(done)["authorization_code"] as? String)

            // The code is redeemed without redirect_uri, with the verifier; sealed tokens come back.
            let tokens = try await client.postToken(["grant_type": "authorization_code", "client_id": "com.example.inapp", "code": code,
                                                     "code_verifier": TestGatehouse.verifier])
            #expect(tokens.status == .ok)
            #expect((json(tokens)["access_token"] as? String)?.hasPrefix("gh") == true)
            #expect(json(tokens)["access_token"] as? String != "upstream-at")
        }
    }

    @Test func aChallengeCodeIsRefusedWithARedirectURIAndAnAuthorizeCodeWithoutOne() async throws {
        try await Self.withRouter { harness, client, _ in
            harness.steps.then(Self.signedIn)
            let code = try await client.signIn()
            let withRedirect = try await client.postToken(["grant_type": "authorization_code", "client_id": "com.example.inapp", "code": code,
                                                           "code_verifier": TestGatehouse.verifier, "redirect_uri": "com.example.inapp:/cb"])
            #expect(withRedirect.status == .badRequest)
            #expect(json(withRedirect)["error"] as? String == "invalid_grant")
            // Burned by that attempt (RFC 6749 §4.1.2).
            let again = try await client.postToken(["grant_type": "authorization_code", "client_id": "com.example.inapp", "code": code,
                                                    "code_verifier": TestGatehouse.verifier])
            #expect(json(again)["error"] as? String == "invalid_grant")
        }
    }

    @Test func theAuthSessionIsSingleUseAndChangesOnEveryAnswer() async throws {
        try await Self.withRouter { harness, client, _ in
            let session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            let wrong = try await client.challenge(["auth_session": session, "password": "nope"])
            #expect(wrong.status == .forbidden)
            #expect(json(wrong)["failure"] as? String == "incorrect_password")
            #expect(json(wrong)["step"] as? String == "password")
            let next = try #require(json(wrong)["auth_session"] as? String)
            #expect(next != session)
            // The old one is spent: replaying it reaches nothing.
            let replay = try await client.challenge(["auth_session": session, "password": "guess"])
            #expect(replay.status == .badRequest)
            #expect(json(replay)["error"] as? String == "invalid_session")
            #expect(harness.steps.calls.count == 1)
            // Another app's client_id with it: refused, and spent.
            let other = try await client.challenge(["auth_session": next, "client_id": "com.example.web", "password": "x"])
            #expect(json(other)["error"] as? String == "invalid_session")
            #expect(json(try await client.challenge(["auth_session": next, "password": "x"]))["error"] as? String == "invalid_session")
            // And it expires.
            let fresh = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.clock.advance(seconds: 601)
            #expect(json(try await client.challenge(["auth_session": fresh, "password": "x"]))["error"] as? String == "invalid_session")
            #expect(harness.steps.calls.count == 1)
        }
    }

    @Test func aStepCannotBeSkipped() async throws {
        try await Self.withRouter { harness, client, _ in
            let session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            for (field, value) in [("otp", "123456"), ("unblock_code", "123456"), ("email_code", "abc")] {
                let skipped = try await client.challenge(["auth_session": session, field: value])
                #expect(skipped.status == .badRequest || json(skipped)["error"] as? String == "invalid_session", "\(field)")
            }
            let fresh = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            let skipped = try await client.challenge(["auth_session": fresh, "otp": "123456"])
            #expect(json(skipped)["error"] as? String == "invalid_request")
            #expect((json(skipped)["error_description"] as? String)?.contains("password") == true)
            // A password and another step's field together: refused too.
            let next = try #require(json(skipped)["auth_session"] as? String)
            let both = try await client.challenge(["auth_session": next, "password": "pw", "otp": "123456"])
            #expect(json(both)["error"] as? String == "invalid_request")
            #expect(harness.steps.calls.isEmpty)
        }
    }

    @Test func wrongInputsEndTheDialogue() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  attempts: 3\n  unblock_after: 50")) { harness, client, _ in
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            for _ in 0..<2 {
                harness.steps.then(.refused(.wrongInput))
                let wrong = try await client.challenge(["auth_session": session, "password": "nope"])
                #expect(json(wrong)["failure"] as? String == "incorrect_password")
                session = try #require(json(wrong)["auth_session"] as? String)
            }
            harness.steps.then(.refused(.wrongInput))
            let last = try await client.challenge(["auth_session": session, "password": "nope"])
            #expect(last.status == .tooManyRequests)
            #expect(json(last)["failure"] as? String == "too_many_requests")
            #expect(json(last)["auth_session"] == nil)
            #expect(last.headers[.retryAfter] == "30")
            #expect(json(last)["dialogue_ended"] as? Bool == true)
            #expect(json(last)["retry_after"] as? Int == 30)
        }
    }

    @Test func failedPasswordsCountedInTheStoreAskForAnUnblockCodeOnEveryInstance() async throws {
        let yaml = Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 2")
        try await Self.withRouter(yaml: yaml, { harness, client, other in
            let other = try #require(other)
            // Two wrong passwords on this instance, in two dialogues.
            for _ in 0..<2 {
                let session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
                harness.steps.then(.refused(.wrongInput))
                #expect(json(try await client.challenge(["auth_session": session, "password": "nope"]))["failure"] as? String == "incorrect_password")
            }
            // The other instance asks for an unblock code before relaying anything: without a mail
            // relay it cannot send one, and says so; the password never reached the upstream.
            let session = try #require(json(try await other.challenge(Self.begin()))["auth_session"] as? String)
            let blocked = try await other.challenge(["auth_session": session, "password": "correct horse"])
            #expect(blocked.status == .serviceUnavailable)
            #expect(json(blocked)["failure"] as? String == "failed_to_send_email")
            #expect(json(blocked)["auth_session"] != nil)
            #expect(harness.steps.calls.count == 2)
            // Another account is not blocked.
            let fresh = try #require(json(try await other.challenge(Self.begin(login: "grace@example.com")))["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            #expect(try await other.challenge(["auth_session": fresh, "password": "pw"]).status == .ok)
            // After the window, the account's count starts again.
            harness.clock.advance(seconds: 901)
            let later = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            #expect(try await client.challenge(["auth_session": later, "password": "correct horse"]).status == .ok)
        }, secondInstance: true)
    }

    @Test func anUnblockCodeIsEmailedCheckedAndExpires() async throws {
        let yaml = Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 1\n  attempts: 10\n  resends: 2")
        try await Self.withRouter(yaml: yaml, recordingMail: true) { harness, client, _ in
            let mail = try #require(harness.mail)
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "nope"]))["auth_session"] as? String)
            // The account is over the line: the next password is not relayed, a code is e-mailed to it.
            let asked = try await client.challenge(["auth_session": session, "password": "correct horse"])
            #expect(json(asked)["step"] as? String == "unblock_code")
            #expect(mail.messages.map(\.to) == ["ada@example.com"])
            let first = try #require(mail.lastCode)
            #expect(harness.steps.calls.count == 1)
            session = try #require(json(asked)["auth_session"] as? String)
            // A wrong code, then the code without the password: refused, nothing relayed.
            let wrong = try await client.challenge(["auth_session": session, "unblock_code": first == "000000" ? "111111" : "000000",
                                                    "password": "correct horse"])
            #expect(json(wrong)["failure"] as? String == "invalid_unblock_code")
            session = try #require(json(wrong)["auth_session"] as? String)
            let alone = try await client.challenge(["auth_session": session, "unblock_code": first])
            #expect(json(alone)["error"] as? String == "invalid_request")
            session = try #require(json(alone)["auth_session"] as? String)
            // Past its lifetime the right code is wrong too.
            harness.clock.advance(seconds: 601)
            let expired = try await client.challenge(["auth_session": session, "unblock_code": first, "password": "correct horse"])
            #expect(json(expired)["error"] as? String == "invalid_session")  // the dialogue itself lived 10 minutes
            #expect(harness.steps.calls.count == 1)
        }
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 1\n  attempts: 10\n  resends: 2\n  code_lifetime: 1m\n  session_lifetime: 30m"),
                                  recordingMail: true) { harness, client, _ in
            let mail = try #require(harness.mail)
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "nope"]))["auth_session"] as? String)
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "pw"]))["auth_session"] as? String)
            let first = try #require(mail.lastCode)
            harness.clock.advance(seconds: 61)
            let expired = try await client.challenge(["auth_session": session, "unblock_code": first, "password": "pw"])
            #expect(json(expired)["failure"] as? String == "invalid_unblock_code")
            session = try #require(json(expired)["auth_session"] as? String)
            // Resent twice (each a new code, the old one dead), then no more.
            for _ in 0..<2 {
                let resent = try await client.challenge(["auth_session": session, "resend": "unblock_code"])
                #expect(json(resent)["step"] as? String == "unblock_code")
                session = try #require(json(resent)["auth_session"] as? String)
            }
            #expect(mail.messages.count == 3)
            let exhausted = try await client.challenge(["auth_session": session, "resend": "unblock_code"])
            #expect(exhausted.status == .tooManyRequests)
            session = try #require(json(exhausted)["auth_session"] as? String)
            let latest = try #require(mail.lastCode)
            let stale = mail.messages.dropLast().compactMap { $0.body.firstMatch(of: /\b[0-9]{6}\b/).map { String($0.output) } }
            if let old = stale.first(where: { $0 != latest }) {
                let refused = try await client.challenge(["auth_session": session, "unblock_code": old, "password": "pw"])
                #expect(json(refused)["failure"] as? String == "invalid_unblock_code")
                session = try #require(json(refused)["auth_session"] as? String)
            }
            // The latest code with the password: relayed once, signed in, and the account's count cleared.
            harness.steps.then(Self.signedIn)
            let done = try await client.challenge(["auth_session": session, "unblock_code": latest, "password": "pw"])
            #expect(done.status == .ok)
            #expect(harness.steps.calls == ["password:ada@example.com:nope", "password:ada@example.com:pw"])
            #expect(try await harness.store.attemptCount(purpose: InAppSignIn.failurePurpose,
                                                         keyHash: SecureToken.hash("legacy\nada@example.com"), now: harness.clock.now()) == 0)
        }
    }

    /// An app whose installs register as instances of their own, for `yaml(extraClient:)`.
    static let installsClient = """
          - client_id: com.example.installs
            upstream: legacy
            redirect_uris: ["com.example.installs:/cb"]
            in_app_sign_in: on
            instances: {}
        """

    @Test func theAppsOwnClientIDOfAnAppWithInstancesPassesAnUnblockCodeLikeAnUncertifiedInstance() async throws {
        let yaml = Self.yaml(extraClient: Self.installsClient)
        try await Self.withRouter(yaml: yaml, recordingMail: true) { harness, client, _ in
            let session = try #require(json(try await client.challenge(Self.begin(client: "com.example.installs")))["auth_session"] as? String)
            let asked = try await client.challenge(["auth_session": session, "password": "correct horse"])
            #expect(json(asked)["step"] as? String == "unblock_code")
            #expect(harness.mail?.messages.count == 1)
            #expect(harness.steps.calls.isEmpty)
        }
    }

    @Test func everySpellingOfAnAccountIsOneAccount() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 2"), recordingMail: true) { harness, client, _ in
            for spelling in ["ADA@example.com", " \u{FF41}da@example.com "] {  // upper case; a fullwidth a, spaces around
                let session = try #require(json(try await client.challenge(Self.begin(login: spelling)))["auth_session"] as? String)
                harness.steps.then(.refused(.wrongInput))
                #expect(json(try await client.challenge(["auth_session": session, "password": "nope"]))["failure"] as? String == "incorrect_password")
            }
            let session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            #expect(json(try await client.challenge(["auth_session": session, "password": "pw"]))["step"] as? String == "unblock_code")
            #expect(harness.steps.calls == ["password:ADA@example.com:nope", "password:\u{FF41}da@example.com:nope"])
            // A space inside is no spelling of anything.
            #expect(json(try await client.challenge(Self.begin(login: "ada @example.com")))["error"] as? String == "invalid_request")
        }
    }

    @Test func racingPasswordsForOneAccountRelayAtMostTheLimit() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 3\n  emails_per_hour: 20"),
                                  recordingMail: true) { harness, client, _ in
            var sessions: [String] = []
            for _ in 0..<10 {
                sessions.append(try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String))
                harness.steps.then(.refused(.wrongInput))
            }
            let answers = try await withThrowingTaskGroup(of: String?.self) { group in
                for session in sessions {
                    group.addTask { json(try await client.challenge(["auth_session": session, "password": "guess"]))["step"] as? String }
                }
                return try await group.reduce(into: [String?]()) { $0.append($1) }
            }
            // However they interleave, three reached the upstream; the others met the unblock code.
            #expect(harness.steps.calls.count == 3)
            #expect(answers.filter { $0 == "unblock_code" }.count == 7)
        }
    }

    @Test func theUnblockCodeSurvivesAnUpstreamThatCannotAnswer() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 1"), recordingMail: true) { harness, client, _ in
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "nope"]))["auth_session"] as? String)
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "pw"]))["auth_session"] as? String)
            let code = try #require(harness.mail?.lastCode)
            harness.steps.then(.refused(.unavailable))
            let down = try await client.challenge(["auth_session": session, "unblock_code": code, "password": "pw"])
            #expect(json(down)["failure"] as? String == "server_unavailable")
            #expect(json(down)["dialogue_ended"] == nil)
            session = try #require(json(down)["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            #expect(try await client.challenge(["auth_session": session, "unblock_code": code, "password": "pw"]).status == .ok)
        }
    }

    @Test func anAccountGetsALimitedNumberOfEmailsWhateverTheDialogues() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 1\n  emails_per_hour: 2"),
                                  recordingMail: true) { harness, client, _ in
            harness.steps.then(.refused(.wrongInput))
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            session = try #require(json(try await client.challenge(["auth_session": session, "password": "nope"]))["auth_session"] as? String)
            var statuses: [Int] = []
            for _ in 0..<3 {  // three dialogues, each asking for a code
                let fresh = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
                statuses.append(Int(try await client.challenge(["auth_session": fresh, "password": "pw"]).status.code))
            }
            #expect(statuses == [403, 403, 429])
            #expect(harness.mail?.messages.count == 2)
            _ = session
        }
    }

    @Test func secondFactorCodesAreCountedPerAccountAcrossDialogues() async throws {
        try await Self.withRouter(yaml: Self.yaml(inAppSection: "in_app_sign_in:\n  attempts: 3")) { harness, client, _ in
            var calls = 0
            for wrongCodes in [2, 2] {
                var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
                harness.steps.then(.secondFactor(token: "mfa"))
                session = try #require(json(try await client.challenge(["auth_session": session, "password": "pw"]))["auth_session"] as? String)
                for _ in 0..<wrongCodes {
                    harness.steps.then(.refused(.wrongInput))
                    let answer = try await client.challenge(["auth_session": session, "otp": "000000"])
                    guard let next = json(answer)["auth_session"] as? String else {
                        #expect(answer.status == .tooManyRequests)
                        #expect(json(answer)["dialogue_ended"] as? Bool == true)
                        break
                    }
                    session = next
                }
                calls += 1
            }
            // 2 codes in the first dialogue, 1 in the second: the account's third; the fourth was never sent.
            #expect(harness.steps.calls.filter { $0.hasPrefix("otp:") }.count == 3)
            _ = calls
        }
    }

    @Test func descriptionsKeepToTheDraftsCharacters() async throws {
        try await Self.withRouter { _, client, _ in
            var form = Self.begin()
            form["scope"] = #"r\"é"#
            let answer = try await client.challenge(form)
            #expect(json(answer)["error"] as? String == "invalid_scope")
            let description = try #require(json(answer)["error_description"] as? String)
            #expect(description.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) && $0 != "\"" && $0 != "\\" })
        }
    }

    @Test func aSecondFactorIsAskedAndChecked() async throws {
        try await Self.withRouter { harness, client, _ in
            let session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            harness.steps.then(.secondFactor(token: "mfa-token-1"))
            let otp = try await client.challenge(["auth_session": session, "password": "correct horse"])
            #expect(json(otp)["step"] as? String == "otp")
            var next = try #require(json(otp)["auth_session"] as? String)
            // A malformed code is wrong without asking the upstream.
            let malformed = try await client.challenge(["auth_session": next, "otp": "12a456"])
            #expect(json(malformed)["failure"] as? String == "invalid_totp_code")
            next = try #require(json(malformed)["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            let wrong = try await client.challenge(["auth_session": next, "otp": "000000"])
            #expect(json(wrong)["failure"] as? String == "invalid_totp_code")
            #expect(json(wrong)["step"] as? String == "otp")
            next = try #require(json(wrong)["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            let done = try await client.challenge(["auth_session": next, "otp": "123456"])
            #expect(done.status == .ok)
            #expect(harness.steps.calls == ["password:ada@example.com:correct horse", "otp:mfa-token-1:000000", "otp:mfa-token-1:123456"])
        }
    }

    @Test func upstreamFailuresMapToTheCatalog() async throws {
        try await Self.withRouter { harness, client, _ in
            var session = try #require(json(try await client.challenge(Self.begin()))["auth_session"] as? String)
            let cases: [(InAppRefusal, Int, String, String?)] = [
                (.unavailable, 503, "server_unavailable", nil),
                (.timeout, 504, "request_timeout", nil),
                (.rateLimited(retryAfter: 42), 429, "too_many_requests", "42"),
            ]
            for (refusal, status, failure, retryAfter) in cases {
                harness.steps.then(.refused(refusal))
                let answer = try await client.challenge(["auth_session": session, "password": "pw"])
                #expect(answer.status.code == status)
                #expect(json(answer)["failure"] as? String == failure)
                #expect(answer.headers[.retryAfter] == retryAfter)
                // The same step may be tried again.
                session = try #require(json(answer)["auth_session"] as? String)
            }
            harness.steps.then(.refused(.unusable("broken")))
            let broken = try await client.challenge(["auth_session": session, "password": "pw"])
            #expect(broken.status == .badGateway)
            #expect(json(broken)["failure"] as? String == "authentication_failure")
            #expect(json(broken)["auth_session"] == nil)
            #expect((String(buffer: broken.body)).contains("broken") == false)
        }
    }

    // MARK: DPoP binding

    @Test func aDPoPBoundDialogueRefusesAnotherKeyAndBindsItsCode() async throws {
        try await Self.withRouter { harness, client, _ in
            let key = DPoPSigner()
            let first = try await client.challenge(Self.begin(), dpop: key.proof(url: Self.endpoint, now: harness.clock.now()))
            let session = try #require(json(first)["auth_session"] as? String)
            // Stolen to another key, or shown without one: refused and spent.
            let thief = DPoPSigner()
            let stolen = try await client.challenge(["auth_session": session, "password": "pw"],
                                                    dpop: thief.proof(url: Self.endpoint, now: harness.clock.now()))
            #expect(json(stolen)["error"] as? String == "invalid_dpop_proof")
            #expect(json(try await client.challenge(["auth_session": session, "password": "pw"],
                                                    dpop: key.proof(url: Self.endpoint, now: harness.clock.now())))["error"] as? String
                    == "invalid_session")
            #expect(harness.steps.calls.isEmpty)

            let bound = try #require(json(try await client.challenge(Self.begin(), dpop: key.proof(url: Self.endpoint, now: harness.clock.now())))["auth_session"] as? String)
            let bare = try await client.challenge(["auth_session": bound, "password": "pw"])
            #expect(json(bare)["error"] as? String == "invalid_dpop_proof")

            let again = try #require(json(try await client.challenge(Self.begin(), dpop: key.proof(url: Self.endpoint, now: harness.clock.now())))["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            let done = try await client.challenge(["auth_session": again, "password": "pw"], dpop: key.proof(url: Self.endpoint, now: harness.clock.now()))
            let code = try #require(json(done)["authorization_code"] as? String)
            // The code's token request must prove the same key.
            let form = ["grant_type": "authorization_code", "client_id": "com.example.inapp", "code": code, "code_verifier": TestGatehouse.verifier]
            let other = try await client.postToken(form, dpop: thief.proof(url: Self.issuer + "/oauth/token", now: harness.clock.now()))
            #expect(json(other)["error"] as? String == "invalid_dpop_proof")

            let fresh = try #require(json(try await client.challenge(Self.begin(), dpop: key.proof(url: Self.endpoint, now: harness.clock.now())))["auth_session"] as? String)
            harness.steps.then(Self.signedIn)
            let second = try #require(json(try await client.challenge(["auth_session": fresh, "password": "pw"],
                                                                     dpop: key.proof(url: Self.endpoint, now: harness.clock.now())))["authorization_code"] as? String)
            var same = form
            same["code"] = second
            let tokens = try await client.postToken(same, dpop: key.proof(url: Self.issuer + "/oauth/token", now: harness.clock.now()))
            #expect(tokens.status == .ok)
            #expect(json(tokens)["token_type"] as? String == "DPoP")
        }
    }

    // MARK: Who may use it, and the browser

    @Test func onlyAppsWithInAppSignInGetIt() async throws {
        try await Self.withRouter { harness, client, _ in
            let plain = try await client.challenge(Self.begin(client: "com.example.plain"))
            #expect(json(plain)["error"] as? String == "unauthorized_client")
            let unknown = try await client.challenge(Self.begin(client: "com.example.nobody"))
            #expect(unknown.status == .unauthorized)
            #expect(json(unknown)["error"] as? String == "invalid_client")
            var noPKCE = Self.begin()
            noPKCE["code_challenge"] = nil
            #expect(json(try await client.challenge(noPKCE))["error"] as? String == "invalid_request")
            var token = Self.begin()
            token["response_type"] = "token"
            #expect(json(try await client.challenge(token))["error"] as? String == "unsupported_response_type")
            var noHint = Self.begin()
            noHint["login_hint"] = nil
            #expect(json(try await client.challenge(noHint))["error"] as? String == "invalid_request")
            #expect(harness.steps.calls.isEmpty)
            // The metadata says where the endpoint is.
            let metadata = try await client.execute(uri: "/.well-known/oauth-authorization-server", method: .get)
            #expect(json(metadata)["authorization_challenge_endpoint"] as? String == Self.endpoint)
        }
    }

    @Test func anUpstreamWithoutInAppStepsSendsTheAppToTheBrowserWithItsOwnRequest() async throws {
        try await Self.withRouter { _, client, _ in
            let bare = try await client.challenge(Self.begin(client: "com.example.web"))
            #expect(bare.status == .forbidden)
            #expect(json(bare)["error"] as? String == "redirect_to_web")
            #expect(json(bare)["request_uri"] == nil)

            var whole = Self.begin(client: "com.example.web")
            whole["redirect_uri"] = "com.example.web:/cb"
            whole["state"] = "app-state"
            let answer = try await client.challenge(whole)
            let requestURI = try #require(json(answer)["request_uri"] as? String)
            #expect(requestURI.hasPrefix("urn:ietf:params:oauth:request_uri:"))
            #expect(json(answer)["expires_in"] as? Int ?? 0 > 0)
            // Another app cannot use it; then the app's browser does, once.
            let stolen = try await client.execute(uri: "/oauth/authorize?client_id=com.example.inapp&request_uri=\(FormParameters.encode(requestURI))", method: .get)
            #expect(stolen.status == .badRequest)
            let pushed = try await client.challenge(whole)
            let uri = try #require(json(pushed)["request_uri"] as? String)
            let browser = try await client.execute(uri: "/oauth/authorize?client_id=com.example.web&request_uri=\(FormParameters.encode(uri))", method: .get)
            #expect(browser.status == .found)
            #expect(browser.headers[.location]?.hasPrefix("https://web.example.com/authorize?") == true)
            let twice = try await client.execute(uri: "/oauth/authorize?client_id=com.example.web&request_uri=\(FormParameters.encode(uri))", method: .get)
            #expect(twice.status == .badRequest)
        }
    }

    @Test func withoutAnyInAppAppTheEndpointIsNotThere() async throws {
        try await TestGatehouse.withRouter { _, client in
            let answer = try await client.challenge(Self.begin())
            #expect(answer.status == .notFound)
            let metadata = try await client.execute(uri: "/.well-known/oauth-authorization-server", method: .get)
            #expect(json(metadata)["authorization_challenge_endpoint"] == nil)
        }
    }

    @Test func passthroughAppsCannotSignInInTheApp() throws {
        let yaml = Self.yaml(extraClient: """
              - client_id: com.example.passthrough
                upstream: legacy
                token_exposure: passthrough
                redirect_uris: ["com.example.passthrough:/cb"]
                in_app_sign_in: on
            """)
        #expect(throws: (any Error).self) {
            _ = try YAMLConfigurationLoader.load(yaml: yaml, baseDirectory: FileManager.default.temporaryDirectory, environment: ["SECRET": "s"])
        }
        do {
            _ = try YAMLConfigurationLoader.load(yaml: yaml, baseDirectory: FileManager.default.temporaryDirectory, environment: ["SECRET": "s"])
        } catch {
            #expect(String(describing: error).contains("in_app_sign_in"))
            #expect(String(describing: error).contains("sealed"))
        }
    }

    static func begin(client: String = "com.example.inapp", login: String = "ada@example.com") -> [String: String] {
        ["client_id": client, "response_type": "code", "code_challenge": TestGatehouse.challenge, "code_challenge_method": "S256",
         "login_hint": login]
    }
}

extension TestClientProtocol {
    func challenge(_ form: [String: String], dpop: String? = nil) async throws -> TestResponse {
        var headers = HTTPFields()
        headers[.contentType] = "application/x-www-form-urlencoded"
        if let dpop { headers[HTTPField.Name("DPoP")!] = dpop }
        return try await execute(uri: "/oauth/authorize-challenge", method: .post, headers: headers,
                                 body: ByteBuffer(string: FormParameters(form).encoded()))
    }

    func postToken(_ form: [String: String], dpop: String) async throws -> TestResponse {
        var headers = HTTPFields()
        headers[.contentType] = "application/x-www-form-urlencoded"
        headers[HTTPField.Name("DPoP")!] = dpop
        return try await execute(uri: "/oauth/token", method: .post, headers: headers, body: ByteBuffer(string: FormParameters(form).encoded()))
    }

    /// A whole password sign-in whose upstream answer the test scripted; returns the code.
    func signIn() async throws -> String {
        let session = try #require(json(try await challenge(InAppSignInTests.begin()))["auth_session"] as? String)
        return try #require(json(try await challenge(["auth_session": session, "password": "correct horse"]))["authorization_code"] as? String)
    }
}
