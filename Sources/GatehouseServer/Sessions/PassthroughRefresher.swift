import Foundation
import GatehouseCore
import GatehouseUpstreams
import Logging
import Synchronization

/// Refreshes for passthrough apps (the app holds the upstream's tokens) that cannot race.
///
/// Concurrent refreshes of one upstream refresh token make one upstream call, in one process
/// (coalesced) and across instances (a lease in the store, keyed by the token's SHA-256). The
/// answer is stored sealed under a key derived from the old token, so every caller within
/// `sessions.refresh_grace` gets the same pair and the store never holds a usable token; after
/// the window a spent token is `invalid_grant`, as the upstream would say.
final class PassthroughRefresher: Sendable {
    let store: any PassthroughTokenStore
    let grace: Duration
    /// How long the binding of a refresh token to its app is kept (the upstream does not say).
    let bindingLifetime: Double
    let instanceID = String(SecureToken.generate().prefix(12))
    let logger: Logger
    let now: @Sendable () -> Date
    private let inflight = Mutex<[String: Task<Result<Data, OAuthError>, Never>]>([:])
    private static let purpose = "gatehouse passthrough refresh v1"
    /// How long a caller waits for another instance's refresh before answering 503.
    static let waitLimit: Double = 10

    init(store: any PassthroughTokenStore, configuration: GatehouseConfiguration, now: @escaping @Sendable () -> Date, logger: Logger) {
        self.store = store
        self.grace = configuration.sessions?.refreshGrace ?? .seconds(30)
        self.bindingLifetime = (configuration.sessions?.refreshTokenLifetime ?? .seconds(30 * 86400)).inSeconds
        self.now = now
        self.logger = logger
    }

    /// Records which app the tokens of an upstream token response went to.
    func bind(_ response: Data, to client: AppClient) async {
        guard let tokens = try? UpstreamTokenResponse(body: response) else { return }
        let at = now()
        var bindings = [(hash: SecureToken.hash(tokens.accessToken.reveal()),
                         expiresAt: at.addingTimeInterval(tokens.expiresIn.map(Double.init) ?? bindingLifetime))]
        if let refreshToken = tokens.refreshToken {
            bindings.append((hash: SecureToken.hash(refreshToken.reveal()), expiresAt: at.addingTimeInterval(bindingLifetime)))
        }
        do {
            try await store.bindPassthroughTokens(bindings, clientID: client.clientID, upstream: client.upstream)
        } catch {
            logger.warning("could not record which app passthrough tokens went to", metadata: ["client_id": .string(client.clientID)])
        }
    }

    /// The app it was handed to, when Gatehouse recorded one.
    func owner(of token: String) async throws -> String? {
        try await store.passthroughToken(hash: SecureToken.hash(token))?.clientID
    }

    func refresh(_ token: String, scope: String?, client: AppClient, upstream: any UpstreamClient) async throws(OAuthError) -> Data {
        let key = SecureToken.hash(token) + " " + client.clientID + " " + (scope ?? "")
        let task: Task<Result<Data, OAuthError>, Never> = inflight.withLock { tasks in
            if let running = tasks[key] { return running }
            let task = Task<Result<Data, OAuthError>, Never> {
                let result: Result<Data, OAuthError>
                do throws(OAuthError) {
                    result = .success(try await self.coordinate(token, scope: scope, client: client, upstream: upstream))
                } catch {
                    result = .failure(error)
                }
                _ = self.inflight.withLock { $0.removeValue(forKey: key) }
                return result
            }
            tasks[key] = task
            return task
        }
        return try await task.value.get()
    }

    private func coordinate(_ token: String, scope: String?, client: AppClient, upstream: any UpstreamClient) async throws(OAuthError) -> Data {
        let hash = SecureToken.hash(token)
        let deadline = now().addingTimeInterval(Self.waitLimit)
        while now() < deadline {
            let record: PassthroughTokenRecord?
            do { record = try await store.passthroughToken(hash: hash) } catch { throw .serverError("Gatehouse cannot reach its store right now") }
            switch PassthroughRefresh.decide(record, clientID: client.clientID, now: now(), grace: grace) {
            case .otherClient:
                logger.notice("a passthrough refresh token was presented by another app", metadata: ["client_id": .string(client.clientID)])
                throw .invalidGrant("the refresh token was issued to another app")
            case .refuse:
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            case .replay(let sealed):
                guard let body = try? TokenSeal.open(sealed, with: token, purpose: Self.purpose) else {
                    throw .invalidGrant("the refresh token is invalid, expired or revoked")
                }
                return body
            case .wait:
                try? await Task.sleep(for: .milliseconds(50 + Int.random(in: 0..<50)))
            case .refresh:
                // The lease is taken only if no answer stands and no live lease is held: the
                // re-read under the lease is part of the same statement.
                let at = now()
                let leased: Bool
                do {
                    leased = try await store.acquirePassthroughRefresh(
                        hash: hash, clientID: client.clientID, upstream: client.upstream, owner: instanceID,
                        until: at.addingTimeInterval(upstream.settings.refreshLeaseSeconds), now: at,
                        answeredBefore: at.addingTimeInterval(-grace.inSeconds), expiresAt: at.addingTimeInterval(bindingLifetime))
                } catch {
                    throw .serverError("Gatehouse cannot reach its store right now")
                }
                if leased { return try await refreshUnderLease(token, hash: hash, scope: scope, client: client, upstream: upstream) }
            }
        }
        throw .upstreamUnavailable("another request is refreshing this token; try again", retryAfter: 1)
    }

    private func refreshUnderLease(_ token: String, hash: String, scope: String?, client: AppClient,
                                   upstream: any UpstreamClient) async throws(OAuthError) -> Data {
        let fresh: UpstreamTokenResponse
        do throws(OAuthError) {
            fresh = try await upstream.refreshRespectingPolicy(token, scope: scope)
        } catch where error.code == "invalid_grant" {
            // Another instance may have answered after our lease ran out: its answer stands.
            if let stored = try? await storedAnswer(hash, token: token) { return stored }
            let at = now()
            _ = try? await store.answerPassthroughRefresh(hash: hash, sealed: nil, rotated: true, now: at,
                                                          keepUntil: at.addingTimeInterval(grace.inSeconds + 60))
            throw error
        } catch {
            // Unknown or failed: the next attempt asks the store first, then the upstream.
            try? await store.releasePassthroughRefresh(hash: hash, owner: instanceID)
            throw error
        }
        let body = fresh.json
        let rotated = fresh.refreshToken.map { $0.reveal() != token } ?? false
        let at = now()
        do {
            let sealed = try TokenSeal.seal(body, with: token, purpose: Self.purpose)
            let keepUntil = at.addingTimeInterval(rotated ? grace.inSeconds + 60 : bindingLifetime)
            if try await !store.answerPassthroughRefresh(hash: hash, sealed: sealed, rotated: rotated, now: at, keepUntil: keepUntil),
               let stored = try? await storedAnswer(hash, token: token) {
                return stored  // a stale holder's answer came first: one pair for everyone
            }
        } catch {
            logger.error("refreshed passthrough tokens could not be recorded; a concurrent refresh of the same token may fail",
                         metadata: ["client_id": .string(client.clientID)])
        }
        await bind(body, to: client)
        logger.info("passthrough tokens refreshed", metadata: ["client_id": .string(client.clientID), "upstream": .string(client.upstream)])
        return body
    }

    private func storedAnswer(_ hash: String, token: String) async throws -> Data? {
        guard let sealed = try await store.passthroughToken(hash: hash)?.answerSealed else { return nil }
        return try TokenSeal.open(sealed, with: token, purpose: Self.purpose)
    }
}
