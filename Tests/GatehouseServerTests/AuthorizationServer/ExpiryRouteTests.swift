import Foundation
import GatehouseCore
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
/// codes (10 minutes) and the web-session cookie (`webviews.cookie_lifetime`). The clock is the
/// test's: no sleeps.
struct ExpiryRouteTests {
    static let web = "https://app.example.test"

    /// The in-process Gatehouse with webviews and an app whose instances attest with App Attest.
    static func withGatehouse(_ body: @Sendable (TestGatehouse, any TestClientProtocol) async throws -> Void) async throws {
        let base = try await TestGatehouse.make()
        var configuration = base.gatehouse.configuration
        configuration.webviews = WebviewSettings(origins: [web], cookieLifetime: .seconds(120))
        var attesting = try #require(configuration.clients["com.example.sealed"])
        attesting.clientID = "com.example.attesting"
        attesting.instances = InstanceSettings(attestation: .preferred,
                                               apple: AppleAttestationSettings(appID: "ABCDE12345.com.example.attesting"))
        configuration.clients[attesting.clientID] = attesting
        let gatehouse = Gatehouse(configuration: configuration, store: base.store, upstreams: ["legacy": base.upstream],
                                  sessions: base.gatehouse.sessions, now: base.gatehouse.now, logger: base.gatehouse.logger)
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
            let refused = try await Self.openSession(client, code: late)
            #expect(refused.status == .badRequest)
            #expect(String(buffer: refused.body).contains("expired"))
        }
    }

    @Test func theWebSessionCookieEndsWithItsLifetime() async throws {
        try await Self.withGatehouse { test, client in
            let token = try #require(try await SealedSessionTests.signIn(client)["access_token"] as? String)
            let opened = try await Self.openSession(client, code: try await Self.sessionCode(client, token: token))
            let cookie = try #require(opened.headers[.setCookie]?.split(separator: ";").first?.split(separator: "=").last.map(String.init))
            let sessions = try #require(test.gatehouse.sessions)
            let hash = SecureToken.hash(cookie)
            test.clock.advance(seconds: 119)
            #expect(try await sessions.store.session(forAccessTokenHash: hash, now: test.clock.now()) != nil)
            test.clock.advance(seconds: 2)
            #expect(try await sessions.store.session(forAccessTokenHash: hash, now: test.clock.now()) == nil)
        }
    }

    @Test func anAttestationChallengeIsAcceptedForFiveMinutesOnly() async throws {
        try await Self.withGatehouse { test, client in
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            let registered = try await client.execute(uri: "/oauth/register", method: .post, headers: headers,
                                                      body: ByteBuffer(string: #"{"software_id":"com.example.attesting"}"#))
            let instance = try #require(json(registered)["client_id"] as? String, "\(json(registered))")
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

    @Test func anEmailedCertificationCodeIsTriedForTenMinutesOnly() async throws {
        try await Self.withGatehouse { test, client in
            let pending = SecureToken.generate()
            try await test.store.insertCertification(
                idHash: SecureToken.hash(pending), sealed: Data("sealed".utf8),
                codeHash: AppInstances.codeHash(pending: pending, code: "123456"),
                expiresAt: test.clock.now().addingTimeInterval(AppInstances.certificationLifetime))
            test.clock.advance(seconds: 599)
            let wrong = try await Self.form(client, "/oauth/certify", ["pending": pending, "code": "654321"])
            #expect(String(buffer: wrong.body).contains("not the right one"))
            test.clock.advance(seconds: 2)
            let late = try await Self.form(client, "/oauth/certify", ["pending": pending, "code": "123456"])
            #expect(late.status == .badRequest)
            #expect(String(buffer: late.body).contains("has expired"))
        }
    }
}
