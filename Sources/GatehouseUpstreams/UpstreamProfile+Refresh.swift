public import GatehouseCore

extension UpstreamProfile {
    /// A refresh with retries that respect `refresh_token_policy`: a request that provably never
    /// reached the upstream (a refused connection) or that the upstream declined unread (429,
    /// 503) is retried twice, with backoff and jitter; a request whose fate is unknown (a reset
    /// after sending, a 500, 502 or 504) is retried only when the upstream's refresh tokens are
    /// `reusable`, since sending a single-use token twice can make the upstream revoke the family.
    /// OAuth errors (`invalid_grant`, …) are never retried.
    ///
    /// Only quick failures are retried, within the upstream's `timeout` for the whole refresh: an
    /// attempt that waited out a timeout (to connect, or for the answer) ends the refresh, so the
    /// app gets its 503 after one timeout, never after three.
    public func refreshRespectingPolicy(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        let deadline = ContinuousClock.now + settings.timeout
        var attempt = 1
        while true {
            do throws(OAuthError) {
                return try await refresh(refreshToken, scope: scope)
            } catch {
                let retryable = switch error.delivery {
                case .notUpstream: false
                case .unspent: true
                case .unknown: settings.refreshTokenPolicy == .reusable
                }
                // Backoff with jitter: 100–200 ms, then 300–400 ms.
                let pause = Duration.milliseconds(100 * (attempt * 2 - 1) + Int.random(in: 0..<100))
                guard retryable, !error.timedOut, attempt < 3, ContinuousClock.now + pause < deadline else { throw error }
                try? await Task.sleep(for: pause)
                attempt += 1
            }
        }
    }
}
