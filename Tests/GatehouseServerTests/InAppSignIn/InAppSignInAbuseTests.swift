import Foundation
import GatehouseCore
@testable import GatehouseServer
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

/// What a hostile pass tried at the authorization challenge endpoint: other spellings of an
/// account, one password sprayed over many accounts, telling a right password from a wrong one by
/// the upstream's refusal of the account, a web page posting the first request, an oversized body.
struct InAppSignInAbuseTests {
    typealias Base = InAppSignInTests

    // MARK: Spellings

    /// The account is over its line after one wrong password as `victim@…`; its right password
    /// typed in another spelling must meet the unblock code, never the upstream.
    @Test(arguments: [
        ("VICTIM@example.com", "case"),
        ("vïctim@example.com", "a diaeresis"),
        ("víctim@example.com", "an acute accent"),
        ("vi\u{200B}ctim@example.com", "a zero-width space"),
        ("vic\u{00AD}tim@example.com", "a soft hyphen"),
        ("v\u{0131}ctim@example.com", "a dotless i"),
        ("victim\u{2063}@example.com", "an invisible separator"),
        ("\u{FF56}ictim@example.com", "a full-width letter"),
    ])
    func anotherSpellingOfAnAccountOverItsLineMeetsTheUnblockCode(spelling: String, what: String) async throws {
        try await Base.withRouter(yaml: Base.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 1"), recordingMail: true) { harness, client, _ in
            let first = try #require(json(try await client.challenge(Base.begin(login: "victim@example.com")))["auth_session"] as? String)
            harness.steps.then(.refused(.wrongInput))
            let wrong = try await client.challenge(["auth_session": first, "password": "guess"])
            #expect(json(wrong)["failure"] as? String == "incorrect_password")
            harness.steps.then(Base.signedIn)
            let session = try #require(json(try await client.challenge(Base.begin(login: spelling)))["auth_session"] as? String)
            let answer = try await client.challenge(["auth_session": session, "password": "the right one"])
            #expect(harness.steps.calls.count == 1, "\(what): the password was relayed past the account's line")
            if EmailAddress.isValid(spelling) {
                // The login is kept as typed: the code goes to the address the user typed.
                #expect(json(answer)["step"] as? String == "unblock_code", "\(what)")
                #expect(harness.mail?.messages.last?.to == spelling)
            } else {
                // No address a code could be sent to: the browser, with the upstream's own defences.
                #expect(json(answer)["error"] as? String == "redirect_to_web", "\(what)")
                #expect(harness.mail?.messages.isEmpty == true)
            }
        }
    }

    // MARK: Spraying

    @Test func anInstanceTriesPasswordsForAtMostItsAccountsPerWindow() async throws {
        let yaml = Base.yaml(extraClient: Base.installsClient, inAppSection: "in_app_sign_in:\n  accounts_per_instance: 2\n  accounts_window: 10m")
        try await Base.withRouter(yaml: yaml, recordingMail: true, { harness, client, other in
            let other = try #require(other)
            let now = harness.clock.now()
            let instance = InstanceID.make(app: "com.example.installs")
            try await harness.store.insertInstance(InstanceRecord(id: instance, softwareID: "com.example.installs", certification: .manual,
                                                                  certifiedAt: now, createdAt: now, expiresAt: now.addingTimeInterval(86400)))
            func attempt(_ account: String, on client: any TestClientProtocol) async throws -> TestResponse {
                let session = try #require(json(try await client.challenge(Base.begin(client: instance, login: account)))["auth_session"] as? String)
                return try await client.challenge(["auth_session": session, "password": "Summer2026!"])
            }
            // Two accounts, one on each Gatehouse: relayed.
            harness.steps.then(.refused(.wrongInput))
            #expect(json(try await attempt("a@example.com", on: client))["failure"] as? String == "incorrect_password")
            harness.steps.then(.refused(.wrongInput))
            #expect(json(try await attempt("b@example.com", on: other))["failure"] as? String == "incorrect_password")
            // A third account, on either: its password waits for the e-mailed code (whoever reads
            // the account's mail is no sprayer), and nothing reaches the upstream.
            for gatehouse in [client, other] {
                let held = try await attempt("c@example.com", on: gatehouse)
                #expect(json(held)["step"] as? String == "unblock_code")
                #expect(json(held)["auth_session"] != nil)
            }
            #expect(harness.mail?.messages.map(\.to) == ["c@example.com", "c@example.com"])
            #expect(harness.steps.calls == ["password:a@example.com:Summer2026!", "password:b@example.com:Summer2026!"])
            // An account it tried already is not a new one (another spelling of it neither).
            harness.steps.then(.refused(.wrongInput))
            #expect(json(try await attempt("A@EXAMPLE.COM", on: client))["failure"] as? String == "incorrect_password")
            // A right password gives its account back: one more account may be tried.
            harness.steps.then(.secondFactor(token: "mfa"))
            #expect(json(try await attempt("b@example.com", on: client))["step"] as? String == "otp")
            harness.steps.then(.refused(.wrongInput))
            #expect(json(try await attempt("d@example.com", on: other))["failure"] as? String == "incorrect_password")
            // After the window, the instance starts again.
            harness.clock.advance(seconds: 601)
            harness.steps.then(.refused(.wrongInput))
            #expect(json(try await attempt("e@example.com", on: client))["failure"] as? String == "incorrect_password")
        }, secondInstance: true)
    }

    @Test func theBreakerAsksEveryDialogueForTheEmailedCodeUntilItsWindowEnds() async throws {
        let section = "in_app_sign_in:\n  unblock_after: 50\n  breaker_failures: 3\n  breaker_window: 2m"
        try await Base.withRouter(yaml: Base.yaml(inAppSection: section), recordingMail: true, { harness, client, other in
            let other = try #require(other)
            // Three wrong passwords, three accounts, two Gatehouses: the breaker trips.
            for (index, gatehouse) in [client, other, client].enumerated() {
                let session = try #require(json(try await gatehouse.challenge(Base.begin(login: "user\(index)@example.com")))["auth_session"] as? String)
                harness.steps.then(.refused(.wrongInput))
                #expect(json(try await gatehouse.challenge(["auth_session": session, "password": "Summer2026!"]))["failure"] as? String
                    == "incorrect_password")
            }
            // Every dialogue now passes the e-mailed code first, on either Gatehouse, whatever the account.
            for gatehouse in [client, other] {
                let session = try #require(json(try await gatehouse.challenge(Base.begin(login: "fresh@example.com")))["auth_session"] as? String)
                let asked = try await gatehouse.challenge(["auth_session": session, "password": "the right one"])
                #expect(json(asked)["step"] as? String == "unblock_code")
            }
            #expect(harness.steps.calls.count == 3)
            #expect(harness.mail?.messages.map(\.to) == ["fresh@example.com", "fresh@example.com"])
            // A login that is no address goes to the browser.
            let plain = try #require(json(try await client.challenge(Base.begin(login: "plainuser")))["auth_session"] as? String)
            #expect(json(try await client.challenge(["auth_session": plain, "password": "pw"]))["error"] as? String == "redirect_to_web")
            // Past its window the breaker falls back: passwords are relayed again.
            harness.clock.advance(seconds: 121)
            let session = try #require(json(try await other.challenge(Base.begin(login: "later@example.com")))["auth_session"] as? String)
            harness.steps.then(Base.signedIn)
            #expect(try await other.challenge(["auth_session": session, "password": "the right one"]).status == .ok)
            #expect(harness.steps.calls.count == 4)
        }, secondInstance: true)
    }

    // MARK: Refusals of the account

    /// A refusal that may follow the right password answers, whole, as a wrong password does,
    /// and is counted as one; the user who passes the e-mailed code is told what to do.
    @Test(arguments: AccountRefusal.allCases)
    func anAccountRefusalAnswersAsAWrongPasswordUntilTheEmailedCode(reason: AccountRefusal) async throws {
        try await Base.withRouter(yaml: Base.yaml(inAppSection: "in_app_sign_in:\n  unblock_after: 2"), recordingMail: true) { harness, client, _ in
            func attempt(_ outcome: InAppOutcome, login: String) async throws -> TestResponse {
                let session = try #require(json(try await client.challenge(Base.begin(login: login)))["auth_session"] as? String)
                harness.steps.then(outcome)
                return try await client.challenge(["auth_session": session, "password": "pw"])
            }
            let wrong = try await attempt(.refused(.wrongInput), login: "someone@example.com")
            let refused = try await attempt(.refused(.accountRefused(reason)), login: "victim@example.com")
            #expect(refused.status == wrong.status)
            #expect(Self.headers(refused) == Self.headers(wrong))
            var (left, right) = (json(refused), json(wrong))
            #expect(left.removeValue(forKey: "auth_session") != nil && right.removeValue(forKey: "auth_session") != nil)
            #expect(NSDictionary(dictionary: left) == NSDictionary(dictionary: right))
            // Counted as a wrong password: one more, and the account meets the e-mailed code.
            _ = try await attempt(.refused(.accountRefused(reason)), login: "victim@example.com")
            let session = try #require(json(try await client.challenge(Base.begin(login: "victim@example.com")))["auth_session"] as? String)
            let asked = try await client.challenge(["auth_session": session, "password": "pw"])
            #expect(json(asked)["step"] as? String == "unblock_code")
            let code = try #require(harness.mail?.lastCode)
            // Past the code, the user is told, and the dialogue is over.
            harness.steps.then(.refused(.accountRefused(reason)))
            let told = try await client.challenge(["auth_session": try #require(json(asked)["auth_session"] as? String),
                                                   "unblock_code": code, "password": "pw"])
            #expect(told.status == .forbidden)
            #expect(json(told)["error"] as? String == "access_denied")
            #expect(json(told)["failure"] as? String == "account_refused")
            #expect(json(told)["reason"] as? String == reason.rawValue)
            #expect(json(told)["dialogue_ended"] as? Bool == true)
            #expect(json(told)["auth_session"] == nil)
            #expect((json(told)["error_description"] as? String)?.isEmpty == false)
        }
    }

    @Test func anAccountRefusalAfterTheSecondFactorIsTold() async throws {
        try await Base.withRouter { harness, client, _ in
            let session = try #require(json(try await client.challenge(Base.begin()))["auth_session"] as? String)
            harness.steps.then(.secondFactor(token: "mfa-1"))
            let otp = try await client.challenge(["auth_session": session, "password": "pw"])
            harness.steps.then(.refused(.accountRefused(.passwordLeaked)))
            let told = try await client.challenge(["auth_session": try #require(json(otp)["auth_session"] as? String), "otp": "123456"])
            #expect(json(told)["failure"] as? String == "account_refused")
            #expect(json(told)["reason"] as? String == "password_leaked")
        }
    }

    // MARK: Browsers and bodies

    @Test(arguments: [("Origin", "https://evil.example"), ("Origin", "null"), ("Sec-Fetch-Site", "cross-site"),
                      ("Sec-Fetch-Mode", "navigate"), ("Sec-Fetch-Dest", "document")])
    func aRequestABrowserSentIsRefusedBeforeAnyEmail(header: String, value: String) async throws {
        try await Base.withRouter(firstStep: .emailLink, recordingMail: true) { harness, client, _ in
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            headers[HTTPField.Name(header)!] = value
            let answer = try await client.execute(uri: "/oauth/authorize-challenge", method: .post, headers: headers,
                                                  body: ByteBuffer(string: FormParameters(Base.begin()).encoded()))
            #expect(answer.status == .badRequest)
            #expect(json(answer)["error"] as? String == "invalid_request")
            #expect((json(answer)["error_description"] as? String)?.contains(header) == true, "\(json(answer))")
            #expect(harness.steps.calls.isEmpty)  // no link was asked for
            // The same request from an app goes through (the upstream is asked for its link).
            #expect(try await client.challenge(Base.begin()).status == .forbidden)
            #expect(harness.steps.calls == ["link:ada@example.com"])
        }
    }

    @Test func anOversizedBodyIs413AsAtTheTokenEndpoint() async throws {
        try await Base.withRouter { harness, client, _ in
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let limit = harness.gatehouse.configuration.server.maximumBodyBytes
            let body = ByteBuffer(string: FormParameters(Base.begin()).encoded() + "&pad=" + String(repeating: "a", count: limit))
            for path in ["/oauth/authorize-challenge", "/oauth/token"] {
                let answer = try await client.execute(uri: path, method: .post, headers: headers, body: body)
                #expect(answer.status == .contentTooLarge, "\(path)")
                #expect(answer.headers[.contentType]?.hasPrefix("application/problem+json") == true, "\(path)")
            }
        }
    }

    // MARK: Configuration

    @Test func theSprayingLimitsAreReadAndTheBreakerMayBeOff() throws {
        let folder = FileManager.default.temporaryDirectory.appending(path: "in-app-settings-" + SecureToken.generate())
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try Data(TestGatehouse.keyRingLine.utf8).write(to: folder.appending(path: "keys"))
        func load(_ section: String) throws -> InAppSignInSettings {
            try YAMLConfigurationLoader.load(yaml: Base.yaml(inAppSection: section), baseDirectory: folder, environment: ["SECRET": "s"]).inAppSignIn
        }
        let defaults = try load("")
        #expect(defaults.accountsPerAddress == 10 && defaults.accountsPerInstance == 3 && defaults.accountsWindow == .seconds(3600))
        #expect(defaults.breakerFailures == 100 && defaults.breakerWindow == .seconds(300))
        let set = try load("in_app_sign_in:\n  accounts_per_address: 50\n  accounts_per_instance: 4\n  accounts_window: 2h\n  breaker_failures: 500\n  breaker_window: 10m")
        #expect(set.accountsPerAddress == 50 && set.accountsPerInstance == 4 && set.accountsWindow == .seconds(7200))
        #expect(set.breakerFailures == 500 && set.breakerWindow == .seconds(600))
        #expect(try load("in_app_sign_in:\n  breaker_failures: off").breakerFailures == nil)
        #expect(throws: (any Error).self) { try load("in_app_sign_in:\n  accounts_per_address: 0") }
        #expect(throws: (any Error).self) { try load("in_app_sign_in:\n  breaker_failures: many") }
    }

    /// The answer's headers that say anything (Date and the request id differ between any two answers).
    static func headers(_ response: TestResponse) -> [String: String] {
        var fields: [String: String] = [:]
        for field in response.headers where !["date", "x-request-id", "content-length"].contains(field.name.canonicalName.lowercased()) {
            fields[field.name.canonicalName.lowercased()] = field.value
        }
        return fields
    }
}
