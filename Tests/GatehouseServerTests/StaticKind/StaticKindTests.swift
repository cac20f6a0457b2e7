import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseServer
import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import Testing

/// The seam's test: a kind the server has never heard of (`StaticUpstream`, its own folder) is
/// added with one registry line, and every contribution it makes is served: its settings
/// decoded, its sign-in returning through its cookie path, its tokens minted and rotated and
/// revoked, its app route answered.
struct StaticKindTests {
    /// The one registry line.
    static let kinds = UpstreamRegistry.kinds.merging(["static": StaticUpstream.kind]) { _, added in added }

    static let yaml = """
        server:
          public_base_url: https://gatehouse.example.com
        store:
          sqlite_path: ":memory:"
        sessions:
          encryption_keys_file: keys
        upstreams:
          - name: plain
            kind: static
            client_id: gatehouse
            page: https://static.example.com/sign-in
        clients:
          - client_id: com.example.static
            upstream: plain
            token_exposure: sealed
            redirect_uris: ["com.example.static:/cb"]
        """

    static func withRouter(_ body: @Sendable (any TestClientProtocol) async throws -> Void) async throws {
        let folder = FileManager.default.temporaryDirectory.appending(path: "static-kind-" + SecureToken.generate())
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try Data(TestGatehouse.keyRingLine.utf8).write(to: folder.appending(path: "keys"))
        let configuration = try YAMLConfigurationLoader.load(yaml: yaml, baseDirectory: folder, environment: [:], kinds: kinds)
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let profiles = configuration.upstreams.mapValues { UpstreamRegistry.profile(for: $0, httpClient: .shared, logger: logger, kinds: kinds) }
        let sessions = SessionServices(store: store, settings: try #require(configuration.sessions), logger: logger, now: Date.init)
        let gatehouse = Gatehouse(configuration: configuration, store: store, upstreams: profiles, sessions: sessions, logger: logger)
        do {
            try await Application(router: GatehouseApplication.router(for: gatehouse)).test(.router, body)
        } catch {
            try await store.close()
            throw error
        }
        try await store.close()
    }

    /// Authorize, then the static page's way back with the sign-in cookie; Gatehouse's code for the app.
    static func signIn(_ client: any TestClientProtocol, as name: String) async throws -> String {
        let authorize = try await client.execute(
            uri: TestGatehouse.authorizeURI(client: "com.example.static", redirect: "com.example.static:/cb"), method: .get)
        #expect(authorize.status == .found)
        #expect(authorize.headers[.location]?.hasPrefix("https://static.example.com/sign-in?app=gatehouse") == true)
        let cookie = try #require(authorize.headers[.setCookie])
        #expect(cookie.contains("Path=\(StaticUpstream.returnPath);"))
        let state = try #require(cookie.split(separator: ";").first?.split(separator: "=", maxSplits: 1).last.map(String.init))
        var headers = HTTPFields()
        headers[.cookie] = "__Secure-gatehouse-signin=\(state)"
        let back = try await client.execute(uri: StaticUpstream.returnPath + "?code=\(name)", method: .get, headers: headers)
        #expect(back.status == .found)
        return try #require(query(of: back.headers[.location] ?? "")["code"])
    }

    @Test func aKindOutsideTheServerSignsInMintsRotatesAndRevokes() async throws {
        try await Self.withRouter { client in
            let code = try await Self.signIn(client, as: "alice")
            let tokens = try await client.postToken(["grant_type": "authorization_code", "code": code, "client_id": "com.example.static",
                                                     "redirect_uri": "com.example.static:/cb", "code_verifier": TestGatehouse.verifier])
            #expect(tokens.status == .ok)
            #expect(json(tokens)["access_token"] as? String == "static.alice")
            let refreshToken = try #require(json(tokens)["refresh_token"] as? String)

            let rotated = try await client.postToken(["grant_type": "refresh_token", "refresh_token": refreshToken, "client_id": "com.example.static"])
            #expect(rotated.status == .ok)
            let next = try #require(json(rotated)["refresh_token"] as? String)
            #expect(next != refreshToken)

            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let revoked = try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers,
                                                   body: ByteBuffer(string: FormParameters(["token": next, "client_id": "com.example.static"]).encoded()))
            #expect(revoked.status == .ok)
            let afterRevocation = try await client.postToken(["grant_type": "refresh_token", "refresh_token": next, "client_id": "com.example.static"])
            #expect(afterRevocation.status == .badRequest)
            #expect(json(afterRevocation)["error"] as? String == "invalid_grant")
        }
    }

    @Test func aCookieReturningKindIsRefusedAtTheQueryCallback() async throws {
        try await Self.withRouter { client in
            let authorize = try await client.execute(
                uri: TestGatehouse.authorizeURI(client: "com.example.static", redirect: "com.example.static:/cb"), method: .get)
            let cookie = try #require(authorize.headers[.setCookie])
            let state = try #require(cookie.split(separator: ";").first?.split(separator: "=", maxSplits: 1).last.map(String.init))
            // Each kind only through its own way back: the state in a query is not this kind's.
            let misrouted = try await client.execute(uri: "/oauth/callback?code=alice&state=\(state)", method: .get)
            #expect(misrouted.status == .badRequest)
            #expect(misrouted.headers[.location] == nil)
        }
    }

    @Test func theKindsAppRouteIsServedAndOnlyForPost() async throws {
        try await Self.withRouter { client in
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            let hello = try await client.execute(uri: "/static/hello", method: .post, headers: headers, body: ByteBuffer(string: "{}"))
            #expect(hello.status == .ok)
            #expect(hello.headers[.cacheControl] == "no-store")
            #expect(json(hello)["hello"] != nil)
            let get = try await client.execute(uri: "/static/hello", method: .get)
            #expect(get.status == .methodNotAllowed)
        }
    }
}
