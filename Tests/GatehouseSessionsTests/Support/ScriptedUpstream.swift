import Foundation
import GatehouseCore
import GatehouseUpstreams
import Synchronization

/// An upstream whose refreshes answer what the test scripted, counted, optionally held at a gate
/// until the test opens it. Only refresh is used by the refresher; the sign-in is not.
final class ScriptedUpstream: UpstreamProfile {
    struct NoSettings: UpstreamProfileSettings {}

    static let rotated = Data(#"{"access_token":"upstream-at-2","token_type":"Bearer","expires_in":3600,"refresh_token":"upstream-rt-2"}"#.utf8)

    let settings: UpstreamSettings
    private let answer: Mutex<Result<Data, OAuthError>>
    private let refreshed = Mutex<[String]>([])
    /// Where a refresh waits, when set, after it is counted.
    let gate: Gate?
    /// Arrives once per refresh, before the gate.
    let called = Arrivals()

    /// `timeout` bounds `refreshRespectingPolicy`'s retries: the 50 ms default leaves no time for one.
    init(answer: Result<Data, OAuthError> = .success(rotated), gate: Gate? = nil, timeout: Duration = .milliseconds(50),
         policy: RefreshTokenPolicy = .singleUse) {
        settings = UpstreamSettings(name: "legacy", kind: "scripted", clientID: "gatehouse", clientSecret: Secret("upstream-secret"),
                                    timeout: timeout, refreshTokenPolicy: policy, profile: NoSettings())
        self.answer = Mutex(answer)
        self.gate = gate
    }

    /// The refresh tokens the upstream was sent, in order.
    var refreshes: [String] { refreshed.withLock { $0 } }

    func answer(with result: Result<Data, OAuthError>) { answer.withLock { $0 = result } }

    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        refreshed.withLock { $0.append(refreshToken) }
        called.arrive()
        await gate?.wait()
        return try UpstreamTokenResponse(body: answer.withLock { $0 }.get())
    }

    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        throw .serverError("not used by these tests")
    }

    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        throw .serverError("not used by these tests")
    }

    func revoke(_ token: String, hint: String) async {}
}
