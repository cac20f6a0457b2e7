import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseRelay
@testable import GatehouseServer
import GatehouseSessions
import GatehouseStore
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

/// Every short-lived value ends at its route when its lifetime is over, and not a second
/// before: session codes (60 s), attestation challenges (5 minutes), e-mailed certification
/// codes (`AppInstances.certificationLifetime`, as the callback stores them) and the web-session
/// cookie (`webviews.cookie_lifetime`, at the relay). The clock is the test's: no sleeps.
struct ExpiryRouteTests {
    static let web = "https://app.example.test"
    /// An app whose uncertified instances are certified by an e-mailed code after their sign-in.
    static let certifiedApp = "com.example.certified"

    /// The in-process Gatehouse with webviews, an app whose instances attest with App Attest, an
    /// app whose instances are certified by e-mail (through `mailer`), and the route `/api`,
    /// which takes the web-session cookie, over a backend that refuses connections (a request
    /// let through ends 502 or 504: `RateLimitTests.reachedTheBackend`).
    static func withGatehouse(mailer: RecordingMailer = RecordingMailer(),
                              _ body: @Sendable (TestGatehouse, any TestClientProtocol) async throws -> Void) async throws {
        let base = try await TestGatehouse.make()
        var configuration = base.gatehouse.configuration
        configuration.webviews = WebviewSettings(origins: [web], cookieLifetime: .seconds(120))
        var attesting = try #require(configuration.clients["com.example.sealed"])
        attesting.clientID = "com.example.attesting"
        attesting.instances = InstanceSettings(attestation: .preferred,
                                               apple: AppleAttestationSettings(appID: "ABCDE12345.com.example.attesting"))
        configuration.clients[attesting.clientID] = attesting
        var certified = try #require(configuration.clients["com.example.app"])
        certified.clientID = certifiedApp
        certified.redirectURIs = [try RedirectURI(registering: certifiedApp + ":/cb")]
        certified.instances = InstanceSettings(attestation: .required, manualCertification: true)
        configuration.clients[certified.clientID] = certified
        var route = RateLimitTests.route
        route.acceptSessionCookie = true
        configuration.routes = [route]
        configuration.upstreams["legacy"]?.identity = IdentitySettings(kind: .introspection, url: "https://as.example.com/introspect")
        let relay = RelayServices(configuration: configuration, cache: IdentityCache(maximumEntries: 100),
                                  resolvers: ["legacy": NamingResolver(.bySubject)], backendClient: HTTPClient.shared, signer: nil)
        let gatehouse = Gatehouse(configuration: configuration, store: base.store, upstreams: ["legacy": base.upstream], relay: relay,
                                  sessions: base.gatehouse.sessions, now: base.gatehouse.now, logger: base.gatehouse.logger, mailer: mailer)
        let test = TestGatehouse(gatehouse: gatehouse, upstream: base.upstream, clock: base.clock, store: base.store)
        do {
            try await Application(router: GatehouseApplication.router(for: gatehouse)).test(.router) { client in
                try await body(test, client)
            }
        } catch {
            try await base.store.close()
            throw error
        }
        try await base.store.close()
    }

    static func form(_ client: any TestClientProtocol, _ path: String, _ fields: [String: String], headers: HTTPFields = [:])
        async throws -> TestResponse
    {
        var headers = headers
        headers[.contentType] = "application/x-www-form-urlencoded"
        return try await client.execute(uri: path, method: .post, headers: headers, body: ByteBuffer(string: FormParameters(fields).encoded()))
    }

    static func sessionCode(_ client: any TestClientProtocol, token: String) async throws -> String {
        var headers = HTTPFields()
        headers[.authorization] = "Bearer " + token
        let answer = try await form(client, "/oauth/session_code", [:], headers: headers)
        return try #require(json(answer)["session_code"] as? String, "\(json(answer))")
    }

    static func openSession(_ client: any TestClientProtocol, code: String) async throws -> TestResponse {
        try await client.execute(uri: "/session?session_code=\(code)&return_to=\(FormParameters.encode(web + "/inbox"))", method: .get)
    }

    @Test func aSessionCodeOpensAWebSessionUntilItsSixtiethSecondOnly() async throws {
        try await Self.withGatehouse { test, client in
            let token = try #require(try await SealedSessionTests.signIn(client)["access_token"] as? String)
            let kept = try await Self.sessionCode(client, token: token)
            let late = try await Self.sessionCode(client, token: token)
            test.clock.advance(seconds: 59)
            #expect(try await Self.openSession(client, code: kept).status == .seeOther)
            test.clock.advance(seconds: 2)
            // Issued with `kept`, which opened a session at 59 s: the 400 is its expiry.
            #expect(try await Self.openSession(client, code: late).status == .badRequest)
        }
    }

    /// The cookie `/session` sets takes a request through the relay to the backend until
    /// `webviews.cookie_lifetime` is over; a second later the relay refuses it as an ended token.
    @Test func theWebSessionCookieEndsWithItsLifetime() async throws {
        try await Self.withGatehouse { test, client in
            let token = try #require(try await SealedSessionTests.signIn(client)["access_token"] as? String)
            let opened = try await Self.openSession(client, code: try await Self.sessionCode(client, token: token))
            let cookie = try #require(opened.headers[.setCookie]?.split(separator: ";").first.map(String.init))
            let lifetime = try #require(test.gatehouse.configuration.webviews).cookieLifetime.components.seconds
            func relayed() async throws -> TestResponse {
                var headers = HTTPFields()
                headers[.cookie] = cookie
                return try await client.execute(uri: "/api/items", method: .get, headers: headers)
            }
            test.clock.advance(seconds: TimeInterval(lifetime - 1))
            let live = try await relayed()
            #expect(RateLimitTests.reachedTheBackend(live), "\(live.status) \(String(buffer: live.body))")
            test.clock.advance(seconds: 2)
            let ended = try await relayed()
            #expect(ended.status == .unauthorized, "\(ended.status) \(String(buffer: ended.body))")
            #expect(ended.headers[.wwwAuthenticate]?.contains(#"error="invalid_token""#) == true)
        }
    }

    @Test func anAttestationChallengeIsAcceptedForFiveMinutesOnly() async throws {
        try await Self.withGatehouse { test, client in
            let instance = try await Self.register(client, app: "com.example.attesting")
            func challenge() async throws -> String {
                try #require(json(try await Self.form(client, "/oauth/attestation/challenge", ["client_id": instance]))["challenge"] as? String)
            }
            let kept = try await challenge()
            let late = try await challenge()
            let statement = ["client_id": instance, "type": "apple", "key_id": "not base64!", "attestation_object": "AAAA"]
            test.clock.advance(seconds: 299)
            // Within its life the challenge is taken; what fails is the statement that came with it.
            let taken = json(try await Self.form(client, "/oauth/attestation", statement.merging(["challenge": kept]) { $1 }))
            #expect(taken["error"] as? String == "invalid_request", "\(taken)")
            test.clock.advance(seconds: 2)
            let expired = json(try await Self.form(client, "/oauth/attestation", statement.merging(["challenge": late]) { $1 }))
            #expect(expired["error"] as? String == "invalid_attestation", "\(expired)")
            #expect((expired["error_description"] as? String)?.contains("expired") == true)
        }
    }

    /// Two sign-ins of uncertified instances paused at the same second for the e-mailed code (as
    /// the callback stores them): the right code opens the "Allow this app?" page one second
    /// before `AppInstances.certificationLifetime` is over, and is refused as expired one second
    /// after. The e-mail tells the user that lifetime.
    @Test func anEmailedCertificationCodeIsTriedForItsLifetimeOnly() async throws {
        let mailer = RecordingMailer()
        try await Self.withGatehouse(mailer: mailer) { test, client in
            test.upstream.answer(userinfo: Data(#"{"sub":"alice","email":"alice@example.test","email_verified":true}"#.utf8))
            func pausedSignIn() async throws -> (pending: String, code: String) {
                let instance = try await Self.register(client, app: Self.certifiedApp)
                let state = try await client.beginSignIn(client: instance, redirect: Self.certifiedApp + ":/cb")
                let page = try await client.execute(uri: "/oauth/callback?code=upstream-code&state=\(state)", method: .get)
                let html = String(buffer: page.body)
                #expect(page.status == .ok && html.contains("Enter your code"), "\(page.status) \(html)")
                let pending = try #require(html.firstMatch(of: /name="pending" value="([A-Za-z0-9_-]{43})"/)?.1)
                return (String(pending), try #require(mailer.lastCode))
            }
            let kept = try await pausedSignIn()
            let late = try await pausedSignIn()
            let lifetime = AppInstances.certificationLifetime
            #expect(mailer.messages.last?.body.contains("valid for \(Int(lifetime) / 60) minutes") == true)
            test.clock.advance(seconds: lifetime - 1)
            let allowed = try await Self.form(client, "/oauth/certify", ["pending": kept.pending, "code": kept.code])
            #expect(allowed.status == .ok && String(buffer: allowed.body).contains("Allow this app?"), "\(String(buffer: allowed.body))")
            test.clock.advance(seconds: 2)
            let expired = try await Self.form(client, "/oauth/certify", ["pending": late.pending, "code": late.code])
            #expect(expired.status == .badRequest && String(buffer: expired.body).contains("This sign-in has expired"),
                    "\(String(buffer: expired.body))")
        }
    }

    /// Registers an instance of `app`; its client id.
    static func register(_ client: any TestClientProtocol, app: String) async throws -> String {
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        let registered = try await client.execute(uri: "/oauth/register", method: .post, headers: headers,
                                                  body: ByteBuffer(string: #"{"software_id":"\#(app)"}"#))
        return try #require(json(registered)["client_id"] as? String, "\(json(registered))")
    }
}
