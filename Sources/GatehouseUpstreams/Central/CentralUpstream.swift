public import AsyncHTTPClient
public import Foundation
public import GatehouseCore
public import Logging

/// The `central` kind: a central sign-in provider in the broccoliapps style (seed 002).
///
/// - Sign-in: the browser goes to `{web_base}/auth?app&provider`; the provider signs the person
///   in and redirects to the app's registered base URL, `/app/auth/callback?code=…` (Gatehouse's),
///   with no `state`: Gatehouse keeps its state in a `__Secure-` cookie scoped to that path (`signInReturn`).
/// - The one-minute code is verified with `POST {api_base}/v1/auth/verify`, RSA-signed
///   (`CentralRequestSigner`); the answer's user is the grant's userinfo, its `userId` the subject.
/// - There are no upstream tokens: Gatehouse mints the app's own (`CentralMinter`), and never
///   refreshes or revokes anything upstream.
/// - With `app_api`, the seed's `/auth/*` endpoints for apps built against that contract (`appRoutes`).
public struct CentralUpstream: UpstreamProfile {
    public let settings: UpstreamSettings
    public let central: CentralSettings
    public let client: CentralClient
    /// Sign in with Apple on iOS, when `apple:` is configured.
    public let apple: AppleIdentityVerifier?
    /// Magic links sent per mailbox and per client address. A reload keeps the profiles, so the
    /// counts carry over it.
    let magicLinks: MagicLinkLimiter
    let centralMinter: CentralMinter

    public init(settings: UpstreamSettings, central: CentralSettings, httpClient: HTTPClient, logger: Logger) {
        self.settings = settings
        self.central = central
        let client = CentralClient(settings: settings, central: central, httpClient: httpClient, logger: logger)
        self.client = client
        self.apple = central.apple.map { AppleIdentityVerifier(settings: $0, httpClient: httpClient, timeout: settings.timeout,
                                                               telemetry: client.http.telemetry) }
        self.magicLinks = MagicLinkLimiter(mailboxLimit: central.magicLinkLimit, addressLimit: central.magicLinkAddressLimit)
        self.centralMinter = CentralMinter(upstream: settings.name, central: central)
    }

    /// The path the provider's contract fixes under the app's registered base URL.
    static let callbackPath = "/app/auth/callback"

    public var signInReturn: SignInReturn { .cookie(path: Self.callbackPath) }

    public var minter: (any TokenMinter)? { centralMinter }

    public func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        let url = RedirectURI.appending([("app", settings.clientID), ("provider", central.provider.rawValue)], to: central.webBase + "/auth")
        return AuthorizationBegun(url: url, memo: UpstreamMemo())
    }

    public func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        let user: CentralUser
        do throws(CentralFailure) {
            user = try await client.verify(code: code)
        } catch {
            throw error.oauthError
        }
        return UpstreamGrant(tokens: nil, userinfo: user.json, subject: user.userId)
    }

    public var canRefresh: Bool { false }

    public func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        throw .invalidGrant("a central sign-in provider issues no refresh tokens")
    }

    public func revoke(_ token: String, hint: String) async {}

    public var inAppSignIn: (any InAppSignInSteps)? { CentralEmailLinkSteps(upstream: self) }

    /// The relay's default identity for a central app's tokens: Gatehouse's own JWTs, `sub` as the
    /// subject and the seed's `data` members as attributes.
    static let mintedIdentity = IdentitySettings(
        kind: .gatehouse, url: "", subjectPath: "/sub",
        attributePaths: ["userId": "/data/userId", "email": "/data/email", "name": "/data/name", "provider": "/data/provider"])

    static let kind = UpstreamRegistry.Kind(
        decoder: UpstreamKindDecoder(defaultIdentity: mintedIdentity, usesClientSecret: false) { map, _ in
            CentralSettings.decode(map, clientID: map.string("client_id"))
        },
        make: { settings, client, logger in
            guard let central = settings.profile as? CentralSettings else { preconditionFailure("a central upstream without CentralSettings") }
            return CentralUpstream(settings: settings, central: central, httpClient: client, logger: logger)
        })
}

extension CentralUser {
    /// `{"email","name","provider","userId"}`: the userinfo a central session keeps.
    public var json: Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(self)) ?? Data("{}".utf8)
    }
}
