import Foundation
import GatehouseCore
@testable import GatehouseServer
import GatehouseSessions
import GatehouseUpstreams
import HTTPTypes
import HummingbirdTesting
import Logging
import NIOCore
import Synchronization
import Testing

/// The lines written on a logger, kept for the test to read.
final class LogCapture: Sendable {
    struct Line: Sendable {
        let level: Logger.Level
        let message: String
        let metadata: Logger.Metadata

        /// A metadata value as text (`nil` when absent).
        subscript(_ key: String) -> String? { metadata[key].map { "\($0)" } }
    }

    private let captured = Mutex<[Line]>([])

    var lines: [Line] { captured.withLock { $0 } }

    /// A logger labelled `label` writing here, at every level.
    func logger(label: String = AuditLog.label) -> Logger {
        var logger = Logger(label: label) { _ in Handler(capture: self) }
        logger.logLevel = .trace
        return logger
    }

    /// Audit lines of one event.
    func events(_ event: AuditEvent) -> [Line] {
        lines.filter { $0["audit_event"] == event.rawValue }
    }

    fileprivate func append(_ line: Line) {
        captured.withLock { $0.append(line) }
    }

    /// Appends every line to its capture, whatever the level.
    struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        var metadataProvider: Logger.MetadataProvider?

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            capture.append(Line(level: event.level, message: event.message.description,
                                metadata: metadata.merging(event.metadata ?? [:]) { $1 }))
        }
    }
}

/// An upstream whose sign-ins name who signed in (as a validated ID token's `sub` would), over
/// the scripted upstream's answers.
struct SubjectUpstream: UpstreamProfile {
    let scripted: ScriptedUpstream
    let subject: String

    var settings: UpstreamSettings { scripted.settings }

    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        try await scripted.beginAuthorization(start)
    }

    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        var grant = try await scripted.completeAuthorization(code: code, redirectURI: redirectURI, memo: memo, appCodeVerifier: appCodeVerifier)
        grant.subject = subject
        return grant
    }

    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        try await scripted.refresh(refreshToken, scope: scope)
    }

    func revoke(_ token: String, hint: String) async {
        await scripted.revoke(token, hint: hint)
    }
}

/// The audit stream: one `notice` line per security event on `gatehouse.audit`, with the client,
/// the subject's hash and a reason, and never a token, code or secret.
struct AuditTests {
    static let subject = "alice@example.com"

    /// Runs `body` against a router whose Gatehouse audits into `capture`, and whose upstream
    /// says sign-ins are `subject`'s.
    static func withAuditedRouter(_ capture: LogCapture,
                                  _ body: @Sendable (TestGatehouse, any TestClientProtocol) async throws -> Void) async throws {
        try await RateLimitTests.withGatehouse(audit: AuditLog(logger: capture.logger()),
                                               upstream: { SubjectUpstream(scripted: $0, subject: subject) }) { test, client in
            try await body(test, client)
        }
    }

    /// No audit line holds any of `secrets`, in its message or any metadata value.
    static func expectNoSecrets(_ capture: LogCapture, _ secrets: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        for line in capture.lines where line["audit_event"] != nil {
            let text = line.message + " " + line.metadata.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            for secret in secrets where !secret.isEmpty {
                #expect(!text.contains(secret), "an audit line holds a secret: \(text)", sourceLocation: sourceLocation)
            }
        }
    }

    @Test func signInIsAuditedWithTheSubjectHashAndNoToken() async throws {
        let capture = LogCapture()
        try await Self.withAuditedRouter(capture) { test, client in
            let state = try await client.beginSignIn()
            let code = try await client.completeCallback(state: state)
            let response = try await client.postToken(CallbackAndTokenTests.codeGrant(code))
            #expect(response.status == .ok)
            let signIns = capture.events(.sign_in)
            try #require(signIns.count == 1)
            #expect(signIns[0].level == .notice)
            #expect(signIns[0].message == "sign_in")
            #expect(signIns[0]["client_id"] == "com.example.app")
            #expect(signIns[0]["subject_hash"] == AuditLog.subjectHash(Self.subject))
            #expect(signIns[0]["subject_hash"]?.count == 16)
            Self.expectNoSecrets(capture, [Self.subject, code, state, "upstream-at", "upstream-rt", "upstream-code", TestGatehouse.verifier,
                                           "upstream-secret"])
        }
    }

    @Test func refreshOfASealedSessionIsAuditedWithItsSubject() async throws {
        let capture = LogCapture()
        try await Self.withAuditedRouter(capture) { test, client in
            let pair = try await SealedSessionTests.signIn(client)
            let access = try #require(pair["access_token"] as? String)
            let refresh = try #require(pair["refresh_token"] as? String)
            try await Self.nameSubject(of: access, test: test)
            let rotated = json(try await SealedSessionTests.refresh(client, refresh))
            #expect(rotated["refresh_token"] is String)
            let refreshes = capture.events(.refresh)
            try #require(refreshes.count == 1)
            #expect(refreshes[0]["client_id"] == "com.example.sealed")
            #expect(refreshes[0]["subject_hash"] == AuditLog.subjectHash(Self.subject))
            Self.expectNoSecrets(capture, [access, refresh, rotated["access_token"] as? String ?? "", rotated["refresh_token"] as? String ?? "",
                                           Self.subject])
        }
    }

    @Test func reuseAfterGraceIsAuditedAsReuseThenFamilyRevoked() async throws {
        let capture = LogCapture()
        try await Self.withAuditedRouter(capture) { test, client in
            let pair = try await SealedSessionTests.signIn(client)
            let old = try #require(pair["refresh_token"] as? String)
            try await Self.nameSubject(of: try #require(pair["access_token"] as? String), test: test)
            let new = try #require(json(try await SealedSessionTests.refresh(client, old))["refresh_token"] as? String)
            test.clock.advance(seconds: 31)
            #expect(try await SealedSessionTests.refresh(client, old).status == .badRequest)
            let reuse = capture.events(.reuse_detected)
            let revoked = capture.events(.family_revoked)
            try #require(reuse.count == 1 && revoked.count == 1)
            #expect(reuse[0]["client_id"] == "com.example.sealed")
            #expect(reuse[0]["subject_hash"] == AuditLog.subjectHash(Self.subject))
            #expect(reuse[0]["reason"] != nil)
            #expect(revoked[0]["subject_hash"] == AuditLog.subjectHash(Self.subject))
            #expect(revoked[0]["reason"] == "refresh_token_reuse")
            // Reuse first, then the revocation it caused.
            let order = capture.lines.compactMap { $0["audit_event"] }
            let reuseAt = try #require(order.firstIndex(of: "reuse_detected"))
            let revokedAt = try #require(order.firstIndex(of: "family_revoked"))
            #expect(reuseAt < revokedAt)
            Self.expectNoSecrets(capture, [old, new, Self.subject])
        }
    }

    @Test func revokeThatEndsASessionIsAudited() async throws {
        let capture = LogCapture()
        try await Self.withAuditedRouter(capture) { test, client in
            let pair = try await SealedSessionTests.signIn(client)
            let refresh = try #require(pair["refresh_token"] as? String)
            try await Self.nameSubject(of: try #require(pair["access_token"] as? String), test: test)
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let response = try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers, body: ByteBuffer(
                string: FormParameters(["token": refresh, "client_id": "com.example.sealed"]).encoded()))
            #expect(response.status == .ok)
            let revokes = capture.events(.revoke)
            try #require(revokes.count == 1)
            #expect(revokes[0]["client_id"] == "com.example.sealed")
            #expect(revokes[0]["subject_hash"] == AuditLog.subjectHash(Self.subject))
            #expect(revokes[0]["reason"] == "session_ended")
            // A second revocation ends nothing: nothing more to audit.
            _ = try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers, body: ByteBuffer(
                string: FormParameters(["token": refresh, "client_id": "com.example.sealed"]).encoded()))
            #expect(capture.events(.revoke).count == 1)
            Self.expectNoSecrets(capture, [refresh, Self.subject])
        }
    }

    @Test func rateLimitedRequestIsAuditedWithTheLimit() async throws {
        let capture = LogCapture()
        let limits = RateLimitSettings(oauthPerClient: BucketSettings(perSecond: 0.001, burst: 1))
        try await RateLimitTests.withGatehouse(limits: limits, audit: AuditLog(logger: capture.logger())) { test, client in
            _ = try await client.postToken(RateLimitTests.junkCodeGrant(client: "com.example.app"))
            #expect(try await client.postToken(RateLimitTests.junkCodeGrant(client: "com.example.app")).status == .tooManyRequests)
            let limited = capture.events(.rate_limited)
            try #require(limited.count == 1)
            #expect(limited[0]["client_id"] == "com.example.app")
            #expect(limited[0]["reason"] == "oauth_client")
            Self.expectNoSecrets(capture, ["junk-code"])
        }
    }

    /// Records who the session behind `accessToken` belongs to (as the relay's identity
    /// service would for an upstream that issues no ID token).
    static func nameSubject(of accessToken: String, test: TestGatehouse) async throws {
        let sessions = try #require(test.gatehouse.sessions)
        let grant = try #require(try await sessions.store.session(forAccessTokenHash: SecureToken.hash(accessToken), now: test.clock.now()))
        try await sessions.store.setSubject(subject, sessionID: grant.session.id)
    }
}
