package import Foundation
package import GatehouseCore
package import GatehouseUpstreams
package import Logging

/// Refreshes for passthrough apps (the app holds the upstream's tokens) that cannot race.
///
/// Concurrent refreshes of one upstream refresh token make one upstream call, in one process
/// (coalesced) and across instances (a lease in the store, keyed by the token's SHA-256). The
/// answer is stored sealed under a key derived from the old token, so every caller within
/// `sessions.refresh_grace` gets the same pair and the store never holds a usable token; after
/// the window a spent token is `invalid_grant`, as the upstream would say.
package final class PassthroughRefresher: Sendable {
    let store: any PassthroughTokenStore
    let grace: Duration
    /// How long the binding of a refresh token to its app is kept (the upstream does not say).
    let bindingLifetime: Double
    let instanceID = String(SecureToken.generate().prefix(12))
    let logger: Logger
    let audit: AuditLog
    let now: @Sendable () -> Date
    private let refreshes = Coalescer<Result<Data, OAuthError>>()
    private static let purpose = "gatehouse passthrough refresh v1"
    /// How long a caller waits for another instance's refresh before answering 503 (sealed
    /// sessions' refreshes too).
    static let waitLimit: Double = 10

    package init(store: any PassthroughTokenStore, configuration: GatehouseConfiguration, now: @escaping @Sendable () -> Date, logger: Logger,
                 audit: AuditLog = AuditLog()) {
        self.store = store
        self.audit = audit
        self.grace = configuration.sessions?.refreshGrace ?? .seconds(30)
        self.bindingLifetime = (configuration.sessions?.refreshTokenLifetime ?? .seconds(30 * 86400)).inSeconds
        self.now = now
        self.logger = logger
    }

    /// Records which app the tokens of an upstream token response went to.
    package func bind(_ response: Data, to client: AppClient) async {
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
    package func owner(of token: String) async throws -> String? {
        try await store.passthroughToken(hash: SecureToken.hash(token))?.clientID
    }

    /// `admitUnknown` decides, before any upstream call, whether a token Gatehouse has no record
    /// of may be sent on (it throws when not): the record read here says which tokens those are.
    package func refresh(_ token: String, scope: String?, client: AppClient, upstream: any UpstreamProfile,
                         admitUnknown: @escaping @Sendable () throws(OAuthError) -> Void = {}) async throws(OAuthError) -> Data {
        let key = SecureToken.hash(token) + " " + client.clientID + " " + (scope ?? "")
        let (result, joined) = await refreshes.run(key) { () async -> Result<Data, OAuthError> in
            var counted = GatehouseMetrics.RefreshOutcome.failed
            defer { GatehouseMetrics.refresh(counted) }
            do throws(OAuthError) {
                return .success(try await self.coordinate(token, scope: scope, client: client, upstream: upstream,
                                                          admitUnknown: admitUnknown, counted: &counted))
            } catch {
                return .failure(error)
            }
        }
        if joined { GatehouseMetrics.refresh(.coalesced) }
        return try result.get()
    }

    /// One refresh across instances; `counted` ends as its `gatehouse_refreshes_total` outcome:
    /// `performed` (this call got the upstream's answer), `coalesced` (another's answer, within
    /// the grace window), `reuse_detected` (a rotated-out token after it) or `failed`.
    private func coordinate(_ token: String, scope: String?, client: AppClient, upstream: any UpstreamProfile,
                            admitUnknown: @Sendable () throws(OAuthError) -> Void,
                            counted: inout GatehouseMetrics.RefreshOutcome) async throws(OAuthError) -> Data {
        let hash = SecureToken.hash(token)
        let deadline = now().addingTimeInterval(Self.waitLimit)
        var sawAnotherRefresh = false
        var admittedUnknown = false
        while now() < deadline {
            // The record and, when it may be taken, the lease: one statement. After another
            // holder's lease was seen, only the record: whether that lease ended without an answer
            // is read first (below), before the token is sent again. A token Gatehouse has no
            // record of is only read, and admitted or not below before anything is written.
            let owner = newOwner()
            let at = now()
            let attempt: PassthroughLeaseAttempt
            do {
                if sawAnotherRefresh {
                    attempt = PassthroughLeaseAttempt(record: try await store.passthroughToken(hash: hash), leased: false)
                } else {
                    attempt = try await store.readPassthroughRefresh(
                        hash: hash, clientID: client.clientID, owner: owner, until: at.addingTimeInterval(upstream.settings.refreshLeaseSeconds),
                        now: at, answeredBefore: at.addingTimeInterval(-grace.inSeconds))
                }
            } catch {
                throw .serverError("Gatehouse cannot reach its store right now")
            }
            if attempt.leased {
                return try await refreshUnderLease(token, hash: hash, owner: owner, boundBefore: true, scope: scope,
                                                   client: client, upstream: upstream, counted: &counted)
            }
            let record = attempt.record
            if record == nil, !admittedUnknown {
                try admitUnknown()
                admittedUnknown = true
            }
            switch PassthroughRefresh.decide(record, clientID: client.clientID, now: now(), grace: grace) {
            case .otherClient:
                logger.notice("a passthrough refresh token was presented by another app", metadata: ["client_id": .string(client.clientID)])
                throw .invalidGrant("the refresh token was issued to another app")
            case .refuse:
                if let record, record.rotated, record.answerSealed != nil {
                    // Rotated out by an answer older than the grace window: a replay, the upstream's family is at risk.
                    counted = .reuse_detected
                    logger.warning("security event: a replaced passthrough refresh token was presented again",
                                   metadata: ["client_id": .string(client.clientID)])
                    audit.record(.reuse_detected, clientID: client.clientID, subject: nil, reason: "passthrough_refresh_token")
                }
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            case .replay(let sealed):
                guard let body = try? TokenSeal.open(sealed, with: token, purpose: Self.purpose) else {
                    throw .invalidGrant("the refresh token is invalid, expired or revoked")
                }
                counted = .coalesced
                return body
            case .wait:
                sawAnotherRefresh = true
                try? await Task.sleep(for: .milliseconds(50 + Int.random(in: 0..<50)))
            case .refresh:
                // Another instance gave up its lease without an answer: its refresh failed, or its
                // outcome is unknown. Sending the token again now would be a retry the policy may
                // forbid; the caller's next attempt decides. (A lease that ran out, a dead holder,
                // is taken over: its owner is still recorded.)
                if sawAnotherRefresh, record?.leaseOwner == nil, record?.answeredAt == nil {
                    throw .upstreamUnavailable("the authorization server did not complete the refresh; try again")
                }
                // The lease is taken only if no answer stands and no live lease is held: the
                // re-read under the lease is part of the same statement. Each attempt has its own
                // owner, so two attempts of one process can never both hold it.
                let owner = newOwner()
                let at = now()
                let leased: Bool
                do {
                    leased = try await store.acquirePassthroughRefresh(
                        hash: hash, clientID: client.clientID, upstream: client.upstream, owner: owner,
                        until: at.addingTimeInterval(upstream.settings.refreshLeaseSeconds), now: at,
                        answeredBefore: at.addingTimeInterval(-grace.inSeconds), expiresAt: at.addingTimeInterval(bindingLifetime))
                } catch {
                    throw .serverError("Gatehouse cannot reach its store right now")
                }
                if leased {
                    return try await refreshUnderLease(token, hash: hash, owner: owner, boundBefore: record != nil, scope: scope,
                                                       client: client, upstream: upstream, counted: &counted)
                }
                try? await Task.sleep(for: .milliseconds(20 + Int.random(in: 0..<30)))
            }
        }
        throw .upstreamUnavailable("another request is refreshing this token; try again", retryAfter: 1)
    }

    /// A lease owner of its own for each attempt.
    private func newOwner() -> String {
        instanceID + "." + String(SecureToken.generate().prefix(8))
    }

    private func refreshUnderLease(_ token: String, hash: String, owner: String, boundBefore: Bool, scope: String?, client: AppClient,
                                   upstream: any UpstreamProfile, counted: inout GatehouseMetrics.RefreshOutcome) async throws(OAuthError) -> Data {
        let fresh: UpstreamTokenResponse
        do throws(OAuthError) {
            fresh = try await Self.refreshing(token, scope: scope, upstream: upstream, trust: boundBefore ? .known : .unknownToken)
        } catch where error.code == "invalid_grant" {
            // Another instance may have answered after our lease ran out: its answer stands.
            if let stored = try? await storedAnswer(hash, token: token) {
                counted = .coalesced
                return stored
            }
            // Remembered for as long as a binding: a spent token is never sent upstream again.
            let at = now()
            _ = try? await store.answerPassthroughRefresh(hash: hash, sealed: nil, rotated: true, now: at,
                                                          keepUntil: at.addingTimeInterval(bindingLifetime))
            throw error
        } catch {
            // Failed, or its outcome unknown: nothing is recorded as spent, the next attempt asks
            // the store first, then the upstream. A token Gatehouse had never seen is not bound
            // to an app by a refresh that did not succeed.
            try? await store.releasePassthroughRefresh(hash: hash, owner: owner, forget: !boundBefore)
            switch error.delivery {
            case .notUpstream:
                throw error
            case .unknown:
                logger.warning("passthrough refresh outcome unknown; not retried", metadata: ["client_id": .string(client.clientID)])
                throw .upstreamUnavailable("the authorization server did not confirm the refresh; try again")
            case .unspent:
                // A 429 carries the upstream's wait: the app is told the same.
                throw .upstreamUnavailable(error.detail, retryAfter: error.retryAfter ?? 5)
            }
        }
        counted = .performed
        let body = fresh.json
        let rotated = fresh.refreshToken.map { $0.reveal() != token } ?? false
        // The new tokens are bound before anyone can see them: a caller waiting on another
        // instance reads the stored answer, and must find its tokens' owner recorded.
        await bind(body, to: client)
        return await store(body, answering: token, hash: hash, rotated: rotated, client: client)
    }

    /// Stores the upstream's answer sealed under the spent token: three tries, kept as long as a
    /// binding, so a late replay is refused here and never reaches the upstream. The answer the
    /// caller gives: `body`, or an answer a stale holder stored first (one pair for everyone).
    private func store(_ body: Data, answering token: String, hash: String, rotated: Bool, client: AppClient) async -> Data {
        let sealed: Data
        do { sealed = try TokenSeal.seal(body, with: token, purpose: Self.purpose) } catch { return body }
        for attempt in 1...3 {
            let at = now()
            do {
                if try await store.answerPassthroughRefresh(hash: hash, sealed: sealed, rotated: rotated, now: at,
                                                            keepUntil: at.addingTimeInterval(bindingLifetime)) {
                    logger.info("passthrough tokens refreshed", metadata: ["client_id": .string(client.clientID), "upstream": .string(client.upstream)])
                    return body
                }
                if let stored = try? await storedAnswer(hash, token: token) { return stored }
                return body
            } catch {
                try? await Task.sleep(for: .milliseconds(100 * attempt))
            }
        }
        logger.error("refreshed passthrough tokens could not be recorded; a concurrent refresh of the same token may fail",
                     metadata: ["client_id": .string(client.clientID)])
        return body
    }

    /// The upstream refresh, in the backoff lane of its trust (`UpstreamHTTP.Trust`).
    private static func refreshing(_ token: String, scope: String?, upstream: any UpstreamProfile, trust: UpstreamHTTP.Trust)
        async throws(OAuthError) -> UpstreamTokenResponse
    {
        let result: Result<UpstreamTokenResponse, OAuthError> = await UpstreamHTTP.$trust.withValue(trust) {
            do throws(OAuthError) {
                return .success(try await upstream.refreshRespectingPolicy(token, scope: scope))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    private func storedAnswer(_ hash: String, token: String) async throws -> Data? {
        guard let sealed = try await store.passthroughToken(hash: hash)?.answerSealed else { return nil }
        return try TokenSeal.open(sealed, with: token, purpose: Self.purpose)
    }
}
