import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseServer
import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import Hummingbird
import HummingbirdTesting
import Logging
import Synchronization

/// A clock the test moves by hand.
final class ManualClock: Sendable {
    private let current = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
    func now() -> Date { current.withLock { $0 } }
    func advance(seconds: TimeInterval) { current.withLock { $0 += seconds } }
}

/// An upstream that answers what the test scripted and records what it was asked; the
/// authorize URL and what the transaction remembers are the real `oauth2` profile's.
/// In-process tests only: the end-to-end suite talks to a real authorization server.
final class ScriptedUpstream: UpstreamProfile {
    let settings: UpstreamSettings
    private let profile: OAuth2Upstream
    private let script: Mutex<Result<Data, OAuthError>>
    private let userinfo = Mutex<Data?>(nil)
    private let calls = Mutex<[String]>([])

    init(settings: UpstreamSettings, answer: Result<Data, OAuthError>) {
        self.settings = settings
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        self.profile = OAuth2Upstream(settings: settings, httpClient: .shared, logger: logger)
        self.script = Mutex(answer)
    }

    var recordedCalls: [String] { calls.withLock { $0 } }
    func answer(with result: Result<Data, OAuthError>) { script.withLock { $0 = result } }
    /// The userinfo claims (a JSON object) the sign-ins from now on come with.
    func answer(userinfo: Data?) { self.userinfo.withLock { $0 = userinfo } }

    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        try await profile.beginAuthorization(start)
    }

    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        let verifier = memo.forwardsAppVerifier ? appCodeVerifier : memo.codeVerifier
        calls.withLock { $0.append("code:\(code):\(verifier ?? "-")") }
        return UpstreamGrant(tokens: try UpstreamTokenResponse(body: script.withLock { $0 }.get()), userinfo: userinfo.withLock { $0 })
    }

    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        calls.withLock { $0.append("refresh:\(refreshToken)") }
        return try UpstreamTokenResponse(body: script.withLock { $0 }.get())
    }

    func revoke(_ token: String, hint: String) async {
        calls.withLock { $0.append("revoke:\(hint)") }
    }
}

struct TestGatehouse {
    static let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    static let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    static let tokenJSON = Data(#"{"access_token":"upstream-at","token_type":"Bearer","expires_in":3600,"refresh_token":"upstream-rt"}"#.utf8)

    let gatehouse: Gatehouse
    let upstream: ScriptedUpstream
    let clock: ManualClock
    let store: SQLiteAuthorizationStore

    static let keyRingLine = "k1 " + SecureToken.generate()
    static let keyRing = try! KeyRing(parsing: keyRingLine)

    static func make(pkce: Bool = false, grace: Duration = .seconds(30), policy: RefreshTokenPolicy = .singleUse) async throws -> TestGatehouse {
        let settings = UpstreamSettings(
            name: "legacy", kind: "oauth2", clientID: "gatehouse", clientSecret: Secret("upstream-secret"),
            scopes: ["read"], refreshTokenPolicy: policy,
            profile: OAuth2Settings(authorizationEndpoint: "https://as.example.com/authorize", tokenEndpoint: "https://as.example.com/token",
                                    pkce: pkce))
        let callbackClient = AppClient(clientID: "com.example.app", upstream: "legacy", tokenExposure: .passthrough,
                                       redirectURIs: [try RedirectURI(registering: "com.example.app:/cb")], scopes: ["read"])
        let relayClient = AppClient(clientID: "com.example.relay", upstream: "legacy", wiring: .relay, tokenExposure: .passthrough,
                                    redirectURIs: [try RedirectURI(registering: "com.example.relay:/cb")], scopes: ["read"])
        let otherClient = AppClient(clientID: "com.example.other", upstream: "legacy", tokenExposure: .passthrough,
                                    redirectURIs: [try RedirectURI(registering: "com.example.other:/cb")], scopes: ["read"])
        let sealedClient = AppClient(clientID: "com.example.sealed", upstream: "legacy", tokenExposure: .sealed,
                                     redirectURIs: [try RedirectURI(registering: "com.example.sealed:/cb")], scopes: ["read"])
        let sessionSettings = SessionSettings(keyRing: keyRing, refreshGrace: grace)
        let configuration = GatehouseConfiguration(
            server: ServerSettings(publicBaseURL: "https://gatehouse.example.com"),
            store: StoreSettings(sqlitePath: ":memory:"),
            upstreams: ["legacy": settings],
            clients: [callbackClient.clientID: callbackClient, relayClient.clientID: relayClient, sealedClient.clientID: sealedClient,
                      otherClient.clientID: otherClient],
            sessions: sessionSettings)
        let upstream = ScriptedUpstream(settings: settings, answer: .success(tokenJSON))
        let clock = ManualClock()
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let store = try await SQLiteAuthorizationStore.open(path: ":memory:", logger: logger)
        let gatehouse = Gatehouse(configuration: configuration, store: store, upstreams: ["legacy": upstream],
                                  sessions: SessionServices(store: store, settings: sessionSettings, logger: logger, now: { clock.now() }),
                                  now: { clock.now() }, logger: logger)
        return TestGatehouse(gatehouse: gatehouse, upstream: upstream, clock: clock, store: store)
    }

    /// Runs `body` against the in-process router, then closes the store.
    static func withRouter(pkce: Bool = false, grace: Duration = .seconds(30), policy: RefreshTokenPolicy = .singleUse,
                           _ body: @Sendable (TestGatehouse, any TestClientProtocol) async throws -> Void) async throws
    {
        let test = try await make(pkce: pkce, grace: grace, policy: policy)
        do {
            try await Application(router: GatehouseApplication.router(for: test.gatehouse)).test(.router) { client in
                try await body(test, client)
            }
        } catch {
            try await test.store.close()
            throw error
        }
        try await test.store.close()
    }

    static func authorizeURI(client: String = "com.example.app", redirect: String = "com.example.app:/cb",
                             state: String = "app-state", extra: String = "") -> String {
        "/oauth/authorize?response_type=code&client_id=\(client)&redirect_uri=\(FormParameters.encode(redirect))"
            + "&state=\(state)&code_challenge=\(challenge)&code_challenge_method=S256" + extra
    }
}

extension TestClientProtocol {
    /// Runs `/oauth/authorize` and returns Gatehouse's state from the upstream redirect.
    func beginSignIn(client: String = "com.example.app", redirect: String = "com.example.app:/cb") async throws -> String {
        let response = try await execute(uri: TestGatehouse.authorizeURI(client: client, redirect: redirect), method: .get)
        guard response.status == .found, let location = response.headers[.location] else {
            throw TestFailure("authorize answered \(response.status)")
        }
        return try #require(query(of: location)["state"])
    }

    /// Completes the callback and returns Gatehouse's one-time code.
    func completeCallback(state: String) async throws -> String {
        let response = try await execute(uri: "/oauth/callback?code=upstream-code&state=\(state)", method: .get)
        guard response.status == .found, let location = response.headers[.location] else {
            throw TestFailure("callback answered \(response.status)")
        }
        return try #require(query(of: location)["code"])
    }

    func postToken(_ form: [String: String], contentType: String = "application/x-www-form-urlencoded") async throws -> TestResponse {
        var headers = HTTPFields()
        headers[.contentType] = contentType
        return try await execute(uri: "/oauth/token", method: .post, headers: headers,
                                 body: ByteBuffer(string: FormParameters(form).encoded()))
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func query(of location: String) -> [String: String] {
    guard let start = location.firstIndex(of: "?") else { return [:] }
    let form = try? FormParameters(parsing: Array(location[location.index(after: start)...].utf8))
    var result: [String: String] = [:]
    for name in form?.names ?? [] { result[name] = form?[name] }
    return result
}

func json(_ response: TestResponse) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any] ?? [:]
}

import Testing
import NIOCore
import HTTPTypes
