public import Foundation
public import GatehouseCore
public import GatehouseUpstreams
public import Logging
public import GatehouseRelay
import Synchronization

/// Sealed sessions: Gatehouse's own tokens, the sealed upstream tokens behind them, and the
/// upstream refresh that cannot race.
public final class SessionServices: Sendable {
    /// Prefixes of Gatehouse's own tokens: the relay tells them from upstream tokens at a glance.
    package static let accessPrefix = "gha_"
    package static let refreshPrefix = "ghr_"
    /// An access token bound to the app's DPoP key (RFC 9449): only `Authorization: DPoP` with a proof.
    package static let boundAccessPrefix = "ghd_"
    /// The web-session cookie `/session` sets: only in the `__Host-gatehouse-session` cookie.
    package static let cookiePrefix = "ghc_"
    /// The cookie that carries a web session (webviews, `/session`).
    package static let sessionCookieName = "__Host-gatehouse-session"

    /// Whether `token` is one of Gatehouse's access tokens: bearer, DPoP-bound, or web-session cookie.
    package static func isAccessToken(_ token: String) -> Bool {
        token.hasPrefix(accessPrefix) || token.hasPrefix(boundAccessPrefix) || token.hasPrefix(cookiePrefix)
    }

    /// Whether `token` is any of Gatehouse's own tokens (never to be sent to an upstream).
    package static func isGatehouseToken(_ token: String) -> Bool {
        isAccessToken(token) || token.hasPrefix(refreshPrefix)
    }

    public let store: any SessionStore & RevocationAnnouncer
    public let settings: SessionSettings
    let instanceID: String
    let logger: Logger
    package let views = SessionViewCache()
    let now: @Sendable () -> Date
    private let refreshes = Coalescer<RefreshOutcome>()
    /// Upstreams whose profile cannot refresh: their sessions live on Gatehouse's
    /// own lifetimes and are never refreshed upstream.
    let nonRefreshingUpstreams: Set<String>

    public init(store: any SessionStore & RevocationAnnouncer, settings: SessionSettings, logger: Logger,
                nonRefreshingUpstreams: Set<String> = [], now: @escaping @Sendable () -> Date = Date.init) {
        self.nonRefreshingUpstreams = nonRefreshingUpstreams
        self.store = store
        self.settings = settings
        self.instanceID = String(SecureToken.generate().prefix(12))
        self.logger = logger
        self.now = now
    }

    /// What the upstream token response of a session says, opened.
    package struct SessionView: Sendable {
        package let sessionID: String
        package let upstream: String
        package let clientID: String
        package let version: Int
        package let tokens: UpstreamTokenResponse
        package let upstreamExpiresAt: Date?
        /// The userinfo verified at sign-in, exactly as the upstream gave it (OpenID Connect upstreams).
        package var userinfo: Data? = nil
        /// The thumbprint of the DPoP key the session's tokens are bound to (RFC 9449 `cnf.jkt`).
        package var dpopJKT: String? = nil
    }

    /// The member of a session's sealed document that keeps the verified userinfo (as a string,
    /// so its bytes survive exactly); the rest is the upstream's token response.
    static let userinfoMember = "gatehouse_userinfo"

    /// What a session seals: the upstream's token response, plus the verified userinfo.
    /// The member is Gatehouse's alone: an upstream that sends one has it dropped.
    package static func sessionDocument(tokens: Data, userinfo: Data?) throws -> Data {
        guard var object = try JSONSerialization.jsonObject(with: tokens) as? [String: Any] else { return tokens }
        guard userinfo != nil || object[userinfoMember] != nil else { return tokens }
        object[userinfoMember] = userinfo.map { String(decoding: $0, as: UTF8.self) }
        return try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    }

    package enum RefreshOutcome: Sendable {
        case fresh(SessionView)
        /// The upstream said `invalid_grant`, or the session is gone: sign in again.
        case ended
        /// The upstream or the store could not be reached: try again later (after `retryAfter`
        /// seconds when the upstream asked for a wait, its 429); the session lives.
        case unavailable(retryAfter: Int? = nil)
    }

    package func open(_ session: SessionRecord) throws -> SessionView {
        let json = try settings.keyRing.open(session.sealedTokens, keyID: session.keyID, associatedData: session.id)
        let userinfo = ((try? JSONSerialization.jsonObject(with: json)) as? [String: Any])?[Self.userinfoMember] as? String
        return SessionView(sessionID: session.id, upstream: session.upstream, clientID: session.clientID, version: session.version,
                           tokens: try UpstreamTokenResponse(body: json), upstreamExpiresAt: session.upstreamExpiresAt,
                           userinfo: userinfo.map { Data($0.utf8) }, dpopJKT: session.dpopJKT)
    }

    /// Due within min(`upstream_refresh_skew`, half the token's lifetime) of its expiry (`RefreshSchedule`).
    /// Never for an upstream that cannot refresh, nor for a session with no refresh token (its
    /// upstream access token simply runs out; the session lives on Gatehouse's own lifetimes).
    package func needsRefresh(_ view: SessionView, now: Date) -> Bool {
        view.tokens.refreshToken != nil && !nonRefreshingUpstreams.contains(view.upstream) && RefreshSchedule.isDue(expiresAt: view.upstreamExpiresAt, lifetime: view.tokens.expiresIn.map(Double.init),
                              skew: settings.upstreamRefreshSkew, now: now)
    }

    /// The upstream access token behind a Gatehouse access token, refreshed first when it is
    /// about to expire. One refresh per session at a time: coalesced here, leased in the store.
    /// Whether the session behind a Gatehouse access token was opened lately (no store query to find it).
    package func hasOpenView(forGatehouseToken token: String) -> Bool {
        views.get(SecureToken.hash(token), now: now()) != nil
    }

    package func upstreamAccessToken(forGatehouseToken token: String, upstreams: [String: any UpstreamProfile]) async -> RefreshOutcome {
        await view(forGatehouseToken: token, refreshing: true, upstreams: upstreams)
    }

    /// The opened session behind a Gatehouse access token; refreshed first when `refreshing`
    /// and due, else as it is (`/userinfo` reads what was verified at sign-in, nothing upstream).
    package func view(forGatehouseToken token: String, refreshing: Bool, upstreams: [String: any UpstreamProfile]) async -> RefreshOutcome {
        let hash = SecureToken.hash(token)
        let now = self.now()
        if let cached = views.get(hash, now: now), !refreshing || !needsRefresh(cached, now: now) { return .fresh(cached) }
        let grant: (session: SessionRecord, accessExpiresAt: Date)?
        do {
            grant = try await store.session(forAccessTokenHash: hash, now: now)
        } catch {
            return .unavailable()
        }
        guard let grant, var view = try? open(grant.session) else { return .ended }
        if refreshing, needsRefresh(view, now: now) {
            switch await refresh(sessionID: view.sessionID, knownVersion: view.version, upstreams: upstreams) {
            case .fresh(let refreshed): view = refreshed
            case let other: return other
            }
        }
        views.put(hash, view, until: min(grant.accessExpiresAt, now.addingTimeInterval(SessionViewCache.entryLifetime)), now: now)
        return .fresh(view)
    }

    /// Refreshes a session's upstream tokens once, however many ask at the same time.
    /// Counted in `gatehouse_refreshes_total`: whoever waited for this process's refresh is `coalesced`.
    package func refresh(sessionID: String, knownVersion: Int, upstreams: [String: any UpstreamProfile]) async -> RefreshOutcome {
        let (outcome, joined) = await refreshes.run(sessionID) {
            await self.performRefresh(sessionID: sessionID, knownVersion: knownVersion, upstreams: upstreams)
        }
        if joined { GatehouseMetrics.refresh(.coalesced) }
        return outcome
    }

    /// One refresh, counted once: `performed` (the upstream gave new tokens), `coalesced` (another
    /// instance's tokens were used) or `failed` (anything else: the caller gets no new tokens).
    private func performRefresh(sessionID: String, knownVersion: Int, upstreams: [String: any UpstreamProfile]) async -> RefreshOutcome {
        var counted = GatehouseMetrics.RefreshOutcome.failed
        defer { GatehouseMetrics.refresh(counted) }
        let deadline = now().addingTimeInterval(PassthroughRefresher.waitLimit)
        var sawAnotherRefresh = false
        while now() < deadline {
            let session: SessionRecord?
            do { session = try await store.session(id: sessionID) } catch { return .unavailable() }
            guard let session, session.isLive(at: now()), let view = try? open(session) else { return .ended }
            if session.version > knownVersion, !needsRefresh(view, now: now()) {
                counted = .coalesced
                return .fresh(view)
            }
            if sawAnotherRefresh, session.leaseOwner == nil {
                // The other instance gave its lease up without new tokens: its refresh failed or
                // its outcome is unknown. Refreshing again at once would be a retry the upstream's
                // `refresh_token_policy` may forbid; the caller's next attempt does it. (A lease
                // that ran out, a dead holder, keeps its owner and is taken over below.)
                return .unavailable()
            }
            // The lease outlasts the longest refresh this instance may make (`refreshLeaseSeconds`).
            let lease = upstreams[session.upstream]?.settings.refreshLeaseSeconds ?? 32
            let leased: Bool
            do {
                leased = try await store.acquireRefreshLease(sessionID: sessionID, owner: instanceID,
                                                              until: now().addingTimeInterval(lease), now: now())
            } catch { return .unavailable() }
            guard leased else {
                // Another instance is refreshing this session: wait for its result, not a second refresh.
                sawAnotherRefresh = true
                try? await Task.sleep(for: .milliseconds(50 + Int.random(in: 0..<50)))
                continue
            }
            // Read again under the lease: the refresher before us may have finished between our
            // read and our lease, and its refresh token is the only one the upstream still takes.
            let current: SessionRecord?
            do { current = try await store.session(id: sessionID) } catch { return .unavailable() }
            guard let current, current.isLive(at: now()), let currentView = try? open(current) else { return .ended }
            if current.version > knownVersion, !needsRefresh(currentView, now: now()) {
                try? await store.releaseRefreshLease(sessionID: sessionID, owner: instanceID)
                counted = .coalesced
                return .fresh(currentView)
            }
            return await refreshUnderLease(current, view: currentView, upstreams: upstreams, counted: &counted)
        }
        return .unavailable()
    }

    private func refreshUnderLease(_ session: SessionRecord, view: SessionView, upstreams: [String: any UpstreamProfile],
                                   counted: inout GatehouseMetrics.RefreshOutcome) async -> RefreshOutcome {
        guard let upstream = upstreams[session.upstream], let refreshToken = view.tokens.refreshToken else {
            _ = try? await store.revokeSession(id: session.id, ifVersion: session.version, now: now())
            return .ended
        }
        // 1. Ask the upstream, retrying only what `refresh_token_policy` allows (`refreshRespectingPolicy`).
        let fresh: UpstreamTokenResponse?
        do throws(OAuthError) {
            fresh = try await upstream.refreshRespectingPolicy(refreshToken.reveal(), scope: nil)
        } catch where error.code == "invalid_grant" {
            // A newer version means another instance refreshed after our lease ran out: its result stands.
            if let stored = try? await store.session(id: session.id), stored.version > session.version,
               stored.isLive(at: now()), let storedView = try? open(stored) {
                counted = .coalesced
                return .fresh(storedView)
            }
            logger.notice("upstream refused the session's refresh token; session ended", metadata: ["upstream": .string(session.upstream)])
            _ = try? await store.revokeSession(id: session.id, ifVersion: session.version, now: now())
            return .ended
        } catch {
            // Failed, or its outcome unknown: the session lives; the next attempt re-reads the
            // session under a new lease first, in case another instance got an answer meanwhile.
            logger.warning("upstream refresh failed; session kept", metadata: [
                "upstream": .string(session.upstream), "error": .string(error.code),
                "outcome": .string(error.delivery == .unknown ? "unknown" : "not spent"),
            ])
            try? await store.releaseRefreshLease(sessionID: session.id, owner: instanceID)
            return .unavailable(retryAfter: error.retryAfter)
        }
        counted = .performed
        guard let fresh, let merged = try? Self.merge(fresh.json, keepingRefreshTokenOf: view.tokens.json),
              let tokens = try? UpstreamTokenResponse(body: merged),
              let (keyID, sealed) = try? settings.keyRing.seal(merged, associatedData: session.id) else {
            try? await store.releaseRefreshLease(sessionID: session.id, owner: instanceID)
            return .unavailable()
        }
        // 2. The upstream has spent the old refresh token: never ask it again; store the new pair.
        let expiresAt = fresh.expiresIn.map { now().addingTimeInterval(Double($0)) }
        let refreshed = SessionView(sessionID: session.id, upstream: session.upstream, clientID: session.clientID,
                                    version: session.version + 1, tokens: tokens, upstreamExpiresAt: expiresAt, userinfo: view.userinfo,
                                    dpopJKT: view.dpopJKT)
        for attempt in 1...3 {
            if let written = try? await store.writeUpstreamTokens(sessionID: session.id, expectedVersion: session.version, keyID: keyID,
                                                                  sealed: sealed, upstreamExpiresAt: expiresAt) {
                if written {
                    logger.info("upstream tokens refreshed", metadata: ["upstream": .string(session.upstream)])
                    return .fresh(refreshed)
                }
                // Fenced: a newer write exists. Use it when it is live and current; else this request keeps ours.
                if let stored = try? await store.session(id: session.id), stored.isLive(at: now()),
                   let storedView = try? open(stored), !needsRefresh(storedView, now: now()) {
                    return .fresh(storedView)
                }
                return unstored(refreshed)
            }
            try? await Task.sleep(for: .milliseconds(200 * attempt))
        }
        return unstored(refreshed)
    }

    /// The refreshed tokens this request uses even though the store did not take them.
    private func unstored(_ view: SessionView) -> RefreshOutcome {
        logger.error("refreshed upstream tokens could not be stored; the session may need a new sign-in",
                     metadata: ["upstream": .string(view.upstream)])
        return .fresh(view)
    }

    /// Ends a session everywhere: in the store, in this instance's caches, in every other
    /// instance's (announced through the store), and its refresh token at the upstream.
    /// Throws, having done nothing else, when the store cannot record the revocation.
    public func end(_ session: SessionRecord, upstreams: [String: any UpstreamProfile], identityCache: IdentityCache?) async throws {
        try await store.revokeSession(id: session.id, now: now())
        views.dropSession(session.id, now: now())
        let view = try? open(session)
        await store.announce(.session(session.id), logger: logger)
        guard let view else { return }
        let key = TokenKey(token: view.tokens.accessToken.reveal(), upstream: session.upstream)
        identityCache?.invalidate(key: key)
        if let refreshToken = view.tokens.refreshToken, let upstream = upstreams[session.upstream] {
            await upstream.revoke(refreshToken.reveal(), hint: "refresh_token")
            // Again once the upstream has revoked: a request that asked the identity service in
            // between was told "active", and must not stay cached as such.
            identityCache?.invalidate(key: key)
        }
        await store.announce(.identity(key), logger: logger)
    }

    /// An upstream that does not rotate refresh tokens leaves `refresh_token` out: keep the old
    /// one; so too the ID token (needed for logout) and the userinfo verified at sign-in.
    static func merge(_ fresh: Data, keepingRefreshTokenOf old: Data) throws -> Data {
        guard var object = try JSONSerialization.jsonObject(with: fresh) as? [String: Any] else { return fresh }
        let previous = (try? JSONSerialization.jsonObject(with: old)) as? [String: Any] ?? [:]
        object[userinfoMember] = nil  // Gatehouse's own member: never the upstream's word
        for member in ["refresh_token", "id_token", userinfoMember] where object[member] == nil {
            object[member] = previous[member]
        }
        return try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    }
}

/// Gatehouse access token (hash) → opened session, for a few seconds: the relay does not read
/// the store on every request. Revocation drops entries here at once; other instances stop
/// honouring a revoked token when their entry expires (at most 10 s).
package final class SessionViewCache: Sendable {
    private struct Entry {
        let view: SessionServices.SessionView
        let until: Date
    }

    private struct State {
        var entries: [String: Entry] = [:]
        /// Session id → the access-token hashes cached for it, so a revocation drops them directly.
        var bySession: [String: Set<String>] = [:]
        /// Sessions revoked in the last few seconds: a request that read its session just before
        /// the revocation must not cache it again after.
        var revoked: [String: Date] = [:]
    }

    private let state = Mutex(State())
    /// Moves whenever a cached view is dropped or replaced: a copy kept outside the cache (the
    /// fast path's per-connection `SealedMemo`) is good only while this has not moved.
    private let changes = Atomic<UInt64>(0)
    private let capacity = 100_000

    /// The current value of the change counter (read it before `get`, to keep what `get` gave).
    package var generation: UInt64 { changes.load(ordering: .acquiring) }

    private func changed() {
        changes.wrappingAdd(1, ordering: .releasing)
    }
    /// The longest an entry lives, and so how long a revoked session is refused a place.
    static let entryLifetime: TimeInterval = 10

    func get(_ hash: String, now: Date) -> SessionServices.SessionView? {
        entry(hash, now: now)?.view
    }

    /// The cached view and until when it may be used.
    package func entry(_ hash: String, now: Date) -> (view: SessionServices.SessionView, until: Date)? {
        state.withLock { state in
            guard let entry = state.entries[hash] else { return nil }
            guard entry.until > now else {
                state.entries[hash] = nil
                state.bySession[entry.view.sessionID]?.remove(hash)
                return nil
            }
            return (entry.view, entry.until)
        }
    }

    func put(_ hash: String, _ view: SessionServices.SessionView, until: Date, now: Date = Date()) {
        state.withLock { state in
            if let revokedAt = state.revoked[view.sessionID], now.timeIntervalSince(revokedAt) < Self.entryLifetime { return }
            if state.entries.count >= capacity {
                state.entries.removeAll(keepingCapacity: true)
                state.bySession.removeAll(keepingCapacity: true)
                changed()
            }
            if state.entries[hash] != nil { changed() }
            state.entries[hash] = Entry(view: view, until: until)
            state.bySession[view.sessionID, default: []].insert(hash)
        }
    }

    /// Drops a session's views; `revoked` keeps it out of the cache for `entryLifetime`.
    package func dropSession(_ sessionID: String, revoked: Bool = true, now: Date = Date()) {
        state.withLock { state in
            for hash in state.bySession.removeValue(forKey: sessionID) ?? [] { state.entries[hash] = nil }
            changed()
            guard revoked else { return }
            state.revoked = state.revoked.filter { now.timeIntervalSince($0.value) < Self.entryLifetime }
            state.revoked[sessionID] = now
        }
    }
}
