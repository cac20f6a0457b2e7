import Foundation
import GatehouseCore
@testable import GatehouseServer
import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import HTTPTypes
import HummingbirdTesting
import NIOCore
import Testing

struct SealedSessionTests {
    static func signIn(_ client: any TestClientProtocol) async throws -> [String: Any] {
        let state = try await client.beginSignIn(client: "com.example.sealed", redirect: "com.example.sealed:/cb")
        let code = try await client.completeCallback(state: state)
        let response = try await client.postToken(CallbackAndTokenTests.codeGrant(code, client: "com.example.sealed", redirect: "com.example.sealed:/cb"))
        #expect(response.status == .ok)
        return json(response)
    }

    static func refresh(_ client: any TestClientProtocol, _ token: String) async throws -> TestResponse {
        try await client.postToken(["grant_type": "refresh_token", "refresh_token": token, "client_id": "com.example.sealed"])
    }

    @Test func sealedClientGetsGatehouseTokensNeverTheUpstreams() async throws {
        try await TestGatehouse.withRouter { test, client in
            let pair = try await Self.signIn(client)
            let access = try #require(pair["access_token"] as? String)
            let refresh = try #require(pair["refresh_token"] as? String)
            #expect(access.hasPrefix("gha_") && refresh.hasPrefix("ghr_"))
            #expect(access != "upstream-at" && refresh != "upstream-rt")
            #expect(pair["expires_in"] as? Int == 300)
        }
    }

    @Test func refreshRotatesAndTheOldTokenReplaysTheSamePairWithinGrace() async throws {
        try await TestGatehouse.withRouter { test, client in
            let first = try await Self.signIn(client)
            let old = try #require(first["refresh_token"] as? String)
            let rotated = json(try await Self.refresh(client, old))
            let new = try #require(rotated["refresh_token"] as? String)
            #expect(new != old)
            test.clock.advance(seconds: 10)
            let replayed = json(try await Self.refresh(client, old))
            #expect(replayed["refresh_token"] as? String == new)
            #expect(replayed["access_token"] as? String == rotated["access_token"] as? String)
            // The upstream is never asked: app refreshes rotate Gatehouse's tokens only.
            #expect(test.upstream.recordedCalls.allSatisfy { !$0.hasPrefix("refresh:") })
        }
    }

    @Test func replacedTokenAfterGraceRevokesTheWholeFamily() async throws {
        try await TestGatehouse.withRouter { test, client in
            let first = try await Self.signIn(client)
            let old = try #require(first["refresh_token"] as? String)
            let rotated = json(try await Self.refresh(client, old))
            let new = try #require(rotated["refresh_token"] as? String)
            test.clock.advance(seconds: 31)
            let reuse = try await Self.refresh(client, old)
            #expect(reuse.status == .badRequest)
            #expect(json(reuse)["error"] as? String == "invalid_grant")
            // Every token of the family is refused now, the newest included.
            #expect(json(try await Self.refresh(client, new))["error"] as? String == "invalid_grant")
            let sessions = try #require(test.gatehouse.sessions)
            #expect(try await sessions.store.session(forAccessTokenHash: SecureToken.hash(rotated["access_token"] as! String), now: test.clock.now()) == nil)
            #expect(test.upstream.recordedCalls.contains("revoke:refresh_token"))
        }
    }

    @Test func fiftyConcurrentRefreshesRotateOnceAndAllGetTheSamePair() async throws {
        try await TestGatehouse.withRouter { test, client in
            let old = try #require(try await Self.signIn(client)["refresh_token"] as? String)
            let pairs = try await withThrowingTaskGroup(of: [String].self) { group in
                for _ in 0..<50 {
                    group.addTask {
                        let answer = json(try await Self.refresh(client, old))
                        return [answer["access_token"] as? String ?? "", answer["refresh_token"] as? String ?? ""]
                    }
                }
                return try await group.reduce(into: [[String]]()) { $0.append($1) }
            }
            let refreshTokens = Set(pairs.map { $0[1] })
            let accessTokens = Set(pairs.map { $0[0] })
            #expect(!refreshTokens.contains(""))
            #expect(pairs.count == 50)
            #expect(refreshTokens.count == 1)
            #expect(accessTokens.count == 1)
        }
    }

    @Test func revocationEndsTheSessionAndAnswers200EvenForUnknownTokens() async throws {
        try await TestGatehouse.withRouter { test, client in
            let pair = try await Self.signIn(client)
            let revoke: ([String: String]) async throws -> TestResponse = { form in
                var headers = HTTPFields()
                headers[.contentType] = "application/x-www-form-urlencoded"
                return try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers,
                                                body: ByteBuffer(string: FormParameters(form).encoded()))
            }
            #expect(try await revoke(["token": "ghr_unknown", "client_id": "com.example.sealed"]).status == .ok)
            #expect(try await revoke(["token": pair["refresh_token"] as! String, "client_id": "com.example.sealed"]).status == .ok)
            #expect(json(try await Self.refresh(client, pair["refresh_token"] as! String))["error"] as? String == "invalid_grant")
            #expect(test.upstream.recordedCalls.contains("revoke:refresh_token"))
            #expect(try await revoke(["token": "x", "client_id": "nobody"]).status == .unauthorized)
        }
    }

    @Test func theStoreHoldsNoTokenInPlainText() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await TestGatehouse.withRouter { test, client in
            let pair = try await Self.signIn(client)
            // Everything the store holds, read as bytes.
            let sessions = try await test.store.sessions(subject: nil)
            let stored = sessions.map { String(decoding: $0.sealedTokens, as: UTF8.self) + $0.id }.joined()
            for secret in ["upstream-at", "upstream-rt", pair["access_token"] as! String, pair["refresh_token"] as! String] {
                #expect(!stored.contains(secret))
            }
            #expect(try await test.store.refreshToken(hash: pair["refresh_token"] as! String) == nil)  // kept only as a hash
        }
    }

    @Test func upstreamRefreshFailureKeepsTheSessionAndInvalidGrantEndsIt() async throws {
        try await TestGatehouse.withRouter { test, client in
            let pair = try await Self.signIn(client)
            let sessions = try #require(test.gatehouse.sessions)
            let access = pair["access_token"] as! String
            let record = try #require(try await sessions.store.session(forAccessTokenHash: SecureToken.hash(access), now: Date()))
            test.upstream.answer(with: .failure(.upstreamUnavailable("down")))
            let unavailable = await sessions.refresh(sessionID: record.session.id, knownVersion: record.session.version,
                                                     upstreams: test.gatehouse.upstreams)
            guard case .unavailable = unavailable else { Issue.record("expected unavailable"); return }
            #expect(try await sessions.store.session(id: record.session.id)?.revokedAt == nil)

            test.upstream.answer(with: .success(Data(#"{"access_token":"upstream-at-2","token_type":"Bearer","expires_in":3600}"#.utf8)))
            guard case .fresh(let view) = await sessions.refresh(sessionID: record.session.id, knownVersion: record.session.version,
                                                                 upstreams: test.gatehouse.upstreams) else { Issue.record("expected fresh"); return }
            #expect(view.tokens.accessToken.reveal() == "upstream-at-2")
            #expect(view.tokens.refreshToken?.reveal() == "upstream-rt")  // kept: the upstream did not rotate it

            test.upstream.answer(with: .failure(.invalidGrant("used")))
            guard case .ended = await sessions.refresh(sessionID: record.session.id, knownVersion: view.version,
                                                       upstreams: test.gatehouse.upstreams) else { Issue.record("expected ended"); return }
            #expect(try await sessions.store.session(id: record.session.id)?.revokedAt != nil)
        }
    }
}

extension SealedSessionTests {
    @Test func rotatedKeyRingReSealsOldSessionsUnderTheNewKey() async throws {
        try await TestGatehouse.withRouter { test, client in
            let pair = try await Self.signIn(client)
            let sessions = try #require(test.gatehouse.sessions)
            let before = try #require(try await sessions.store.session(forAccessTokenHash: SecureToken.hash(pair["access_token"] as! String), now: Date()))
            #expect(before.session.keyID == "k1")
            // `gatehouse keys rotate`: a new key first, the old one still in the ring.
            let rotated = try KeyRing(parsing: "k2 \(SecureToken.generate())\n" + "k1 " + String(TestGatehouse.keyRingLine.split(separator: " ")[1]))
            var settings = sessions.settings
            settings.keyRing = rotated
            let reencryption = Reencryption(sessions: SessionServices(store: sessions.store, settings: settings, logger: test.gatehouse.logger),
                                            interval: .seconds(60), logger: test.gatehouse.logger)
            await reencryption.reencryptBatch()
            let after = try #require(try await sessions.store.session(id: before.session.id))
            #expect(after.keyID == "k2")
            #expect(after.sealedTokens != before.session.sealedTokens)
            let opened = try rotated.open(after.sealedTokens, keyID: "k2", associatedData: after.id)
            #expect(String(decoding: opened, as: UTF8.self).contains("upstream-at"))
            // A ciphertext moved onto another session does not open (the session id is bound to it).
            #expect(throws: (any Error).self) { try rotated.open(after.sealedTokens, keyID: "k2", associatedData: "another-session") }
        }
    }
}
