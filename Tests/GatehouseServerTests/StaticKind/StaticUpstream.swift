import AsyncHTTPClient
import Foundation
import GatehouseCore
import GatehouseUpstreams
import Logging

/// A fifth kind, written as an exercise of the seam: everything it is lives in this folder, and
/// the test that uses it adds it with one registry line. A "static" upstream has a sign-in page
/// that sends the browser back to `/static/return` with the person's name as the code and no
/// `state`; Gatehouse mints the app's tokens; `/static/hello` is its app face.
///
/// It touches every contribution a kind can make: its own settings (`page`), a sign-in that
/// returns through a cookie, minted tokens with a rotating refresh-token family, an app route.
struct StaticUpstream: UpstreamProfile {
    struct Settings: UpstreamProfileSettings {
        var page: String
        var mintsTokens: Bool { true }
    }

    static let returnPath = "/static/return"

    let settings: UpstreamSettings
    let page: String

    func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        AuthorizationBegun(url: RedirectURI.appending([("app", settings.clientID)], to: page), memo: UpstreamMemo())
    }

    func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        guard code.allSatisfy(\.isLetter), !code.isEmpty else { throw .invalidGrant("the static page knows nobody of that name") }
        return UpstreamGrant(tokens: nil, userinfo: JSONCoding.encode(["sub": code]), subject: code)
    }

    var canRefresh: Bool { false }

    func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        throw .invalidGrant("a static upstream issues no refresh tokens")
    }

    func revoke(_ token: String, hint: String) async {}

    var signInReturn: SignInReturn { .cookie(path: Self.returnPath) }

    var minter: (any TokenMinter)? { StaticMinter(upstream: settings.name) }

    var appRoutes: [AppRoute] {
        [AppRoute(path: "/static/hello") { request, _ in
            AppResponse(status: 200, json: JSONCoding.encode(["hello": request.clientAddress ?? "?"]))
        }]
    }

    static let kind = UpstreamRegistry.Kind(
        decoder: UpstreamKindDecoder(usesClientSecret: false) { map, _ in
            GatehouseConfiguration.endpoint("page", in: map).map(Settings.init)
        },
        make: { settings, _, _ in
            StaticUpstream(settings: settings, page: (settings.profile as? Settings)?.page ?? "")
        })
}

/// The static kind's tokens: `static.<subject>` access tokens (nothing checks them) and refresh
/// tokens in the server's sealed-session family.
struct StaticMinter: TokenMinter {
    let upstream: String

    func signedIn(userinfo: Data?, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data {
        guard let userinfo, let subject = (try? JSONDecoder().decode([String: String].self, from: userinfo))?["sub"] else {
            throw .serverError("the sign-in carries no verified user")
        }
        do {
            let now = sessions.now
            let sessionID = try await sessions.begin(subject: subject, userinfo: userinfo, clientID: clientID, upstream: upstream,
                                                     createdAt: now, expiresAt: now.addingTimeInterval(3600))
            return try await pair(subject: subject, sessionID: sessionID, sessions: sessions).body
        } catch {
            throw .serverError("the static session could not be recorded")
        }
    }

    func refresh(_ refreshToken: String, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data {
        try await sessions.rotate(refreshToken: refreshToken, hash: refreshTokenHash(refreshToken), clientID: clientID, upstream: upstream) {
            rotation throws(OAuthError) in
            guard let subject = (try? JSONDecoder().decode([String: String].self, from: rotation.userinfo))?["sub"],
                  let next = try? await pair(subject: subject, sessionID: rotation.sessionID, sessions: sessions) else {
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            }
            return MintedSuccessor(body: next.body, refreshHash: refreshTokenHash(next.refreshToken), replacesToken: true)
        }
    }

    func refreshTokenHash(_ token: String) -> String { SecureToken.hash(token) }

    var publicKeys: [[String: String]] { [] }

    private func pair(subject: String, sessionID: String, sessions: any MintedSessions) async throws -> (body: Data, refreshToken: String) {
        let refreshToken = "static-rt." + SecureToken.generate()
        try await sessions.recordRefreshToken(hash: refreshTokenHash(refreshToken), sessionID: sessionID,
                                              expiresAt: sessions.now.addingTimeInterval(3600))
        let body = JSONCoding.encode(["access_token": "static." + subject, "token_type": "Bearer", "refresh_token": refreshToken])
        return (body, refreshToken)
    }
}
