public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import Logging

/// The `oidc` profile: an OpenID Provider. Discovery and keys are fetched when first needed
/// and cached; every sign-in sends a nonce (and PKCE), and its ID token is validated with the
/// configured algorithm pinned (`IDTokenValidator`), its userinfo verified against it.
public struct OIDCUpstream: UpstreamProfile {
    public let settings: UpstreamSettings
    public let oidc: OIDCSettings
    private let http: UpstreamHTTP
    private let provider: OIDCProviderState
    private let logger: Logger

    public init(settings: UpstreamSettings, oidc: OIDCSettings, httpClient: HTTPClient, logger: Logger) {
        self.settings = settings
        self.oidc = oidc
        self.logger = logger
        let http = UpstreamHTTP(settings: settings, httpClient: httpClient, logger: logger)
        self.http = http
        self.provider = OIDCProviderState(settings: oidc, mutualTLS: settings.clientAuthentication.usesCertificate, http: http,
                                          fetcher: http.keySetFetcher())
    }

    static let kind = UpstreamRegistry.Kind(
        decoder: UpstreamKindDecoder(defaultScopes: ["openid"], keepsIdentity: true, acceptsKeyCredentials: true) { map, scopes in
            OIDCSettings.decode(map, scopes: scopes)
        },
        make: { settings, client, logger in
            guard let oidc = settings.profile as? OIDCSettings else { preconditionFailure("an oidc upstream without OIDCSettings") }
            return OIDCUpstream(settings: settings, oidc: oidc, httpClient: client, logger: logger)
        })

    public var canRefresh: Bool { oidc.refreshes }

    public func beginAuthorization(_ start: AuthorizationStart) async throws(OAuthError) -> AuthorizationBegun {
        let endpoints = try await provider.endpoints()
        var memo = UpstreamMemo(nonce: SecureToken.generate(), acrValues: oidc.acrValues, issuer: oidc.issuer,
                                requiresResponseIssuer: endpoints.sendsResponseIssuer)
        var parameters = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", start.redirectURI),
            ("scope", start.scopes.joined(separator: " ")), ("state", start.state), ("nonce", memo.nonce ?? ""),
        ]
        if let acr = oidc.acrValues { parameters.append(("acr_values", acr)) }
        parameters += oidc.extraAuthorizationParameters
        if oidc.pkce { parameters += start.pkceParameters(remembering: &memo) }
        let url = try await http.authorizationURL(endpoint: endpoints.authorization, parameters: parameters,
                                                  pushTo: try pushedAuthorizationEndpoint(endpoints), tokenEndpoint: endpoints.tokenAudience)
        return AuthorizationBegun(url: url, memo: memo)
    }

    /// Where this sign-in's authorization request is pushed (RFC 9126), if it is: when the provider
    /// requires it (`auto`), always, or never, as `pushed_authorization_requests` says.
    private func pushedAuthorizationEndpoint(_ endpoints: OIDCEndpoints) throws(OAuthError) -> String? {
        switch settings.pushedAuthorization {
        case .never: return nil
        case .auto where !endpoints.requiresPushedAuthorization: return nil
        case .auto, .always:
            guard let url = endpoints.pushedAuthorizationRequest else {
                throw .badUpstream("the upstream's discovery document names no usable pushed_authorization_request_endpoint")
            }
            return url
        }
    }

    public func completeAuthorization(code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamGrant
    {
        // Begun by this profile (a nonce and the issuer bound to the transaction), or not at all:
        // a transaction begun under another kind's settings never skips the nonce check.
        guard memo.issuer == oidc.issuer, memo.nonce != nil else {
            throw .badUpstream("the sign-in was begun with another issuer (iss)")
        }
        let endpoints = try await provider.endpoints()
        let tokens = try await http.exchangeCode(url: endpoints.token, code: code, redirectURI: redirectURI, memo: memo,
                                                 appCodeVerifier: appCodeVerifier)
        guard let idToken = tokens.idToken else {
            throw .badUpstream("the upstream's token response has no id_token")
        }
        let keys = try await keySet()
        let claims: IDTokenClaims
        do throws(JOSEError) {
            claims = try await IDTokenValidator.validate(idToken, expecting: IDTokenExpectations(
                issuer: oidc.issuer, clientID: settings.clientID, nonce: memo.nonce, acr: memo.acrValues,
                accessToken: tokens.accessToken.reveal(), algorithm: oidc.algorithm, leeway: oidc.leeway, now: Date()),
                keys: keys, hmacSecret: hmacSecret)
        } catch {
            throw Self.mapped(error, what: "ID token")
        }
        var userinfo: Data?
        if oidc.fetchesUserinfo, let url = endpoints.userinfo {
            userinfo = try await fetchUserinfo(url, accessToken: tokens.accessToken.reveal(), subject: claims.subject)
        }
        logger.info("upstream sign-in verified", metadata: ["upstream": .string(settings.name), "dialect": .string(oidc.dialect)])
        return UpstreamGrant(tokens: tokens, userinfo: userinfo, subject: claims.subject)
    }

    private func fetchUserinfo(_ url: String, accessToken: String, subject: String) async throws(OAuthError) -> Data {
        let answer = try await http.get(url, bearer: accessToken, accept: "application/json, application/jwt", endpoint: .userinfo,
                                       purpose: "userinfo")
        guard answer.body.count <= Self.maximumUserinfoBytes else {
            throw .badUpstream("the upstream's userinfo is larger than \(Self.maximumUserinfoBytes) bytes")
        }
        guard answer.status == 200 else {
            if answer.status == 429 || answer.status == 503 {
                throw OAuthError.upstreamUnavailable("the upstream's userinfo endpoint is temporarily unavailable (HTTP \(answer.status))")
            }
            throw .badUpstream("the upstream's userinfo endpoint answered HTTP \(answer.status)")
        }
        let keys = try await keySet()
        do throws(JOSEError) {
            return try await UserinfoVerifier.verify(body: answer.body, contentType: answer.contentType, expectedSubject: subject,
                                                     algorithm: oidc.algorithm, issuer: oidc.issuer, clientID: settings.clientID,
                                                     keys: keys, hmacSecret: hmacSecret)
        } catch {
            throw Self.mapped(error, what: "userinfo")
        }
    }

    /// Kept in every session view: userinfo is a handful of claims, not a document.
    static let maximumUserinfoBytes = 32 * 1024

    /// A refresh; an ID token in its answer is checked like a hint (signature, issuer, audience,
    /// OpenID Connect Core §12.2) before it is kept for logout or handed to a passthrough app.
    public func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        guard oidc.refreshes else { throw .invalidGrant("this upstream issues no refresh tokens") }
        let tokens = try await http.refresh(url: try await provider.endpoints().token, refreshToken: refreshToken, scope: scope)
        if let idToken = tokens.idToken {
            do throws(OAuthError) {
                _ = try await verifyIDTokenHint(idToken)
            } catch where error.status >= 503 {
                throw error
            } catch {
                throw .badUpstream("the upstream's refreshed ID token failed validation")
            }
        }
        return tokens
    }

    public func revoke(_ token: String, hint: String) async {
        guard let endpoints = try? await provider.endpoints(), let url = endpoints.revocation else { return }
        await http.revoke(url: url, token: token, hint: hint, tokenEndpoint: endpoints.tokenAudience)
    }

    public func endSessionURL(idToken: String, state: String, postLogoutRedirectURI: String) async throws(OAuthError) -> String? {
        guard let url = try await provider.endpoints().endSession else { return nil }
        return RedirectURI.appending([("id_token_hint", idToken), ("state", state), ("post_logout_redirect_uri", postLogoutRedirectURI)],
                                     to: url)
    }

    public func verifyIDTokenHint(_ idToken: String) async throws(OAuthError) -> String {
        let keys = try await keySet()
        let verified: VerifiedJWS
        do throws(JOSEError) {
            verified = try await JWSVerifier.verify(idToken, algorithm: oidc.algorithm, keys: keys, hmacSecret: hmacSecret)
        } catch {
            if error.unavailable { throw Self.mapped(error, what: "ID token") }
            throw .invalidRequest("id_token_hint is not a valid ID token of this upstream (\(error.check))")
        }
        guard (try? IDTokenValidator.issuerAndAudiences(verified.claims, issuer: oidc.issuer, clientID: settings.clientID)) != nil,
              let subject = verified.claims["sub"]?.stringValue else {
            throw .invalidRequest("id_token_hint was not issued to Gatehouse by this upstream")
        }
        return subject
    }

    /// The provider's key set; none for HS256, which only the client secret verifies.
    private func keySet() async throws(OAuthError) -> JWKSCache? {
        oidc.algorithm == .hs256 ? nil : try await provider.keys()
    }

    /// HS256 ID tokens are keyed with the client secret (OpenID Connect Core §10.1); no other algorithm sees it.
    private var hmacSecret: Secret? { oidc.algorithm == .hs256 ? settings.clientSecret : nil }

    static func mapped(_ error: JOSEError, what: String) -> OAuthError {
        if error.unavailable {
            return OAuthError.upstreamUnavailable("the upstream's signing keys cannot be fetched right now")
        }
        return .badUpstream("the upstream's \(what) failed validation (\(error.check)): \(error.detail)")
    }
}

/// An OpenID Provider's discovered endpoints and key set, fetched when first needed and kept.
/// A failed fetch is retried once, then answered `temporarily_unavailable`; a document that
/// was fetched once stays in use if a later fetch fails.
actor OIDCProviderState {
    private let settings: OIDCSettings
    /// Whether Gatehouse authenticates with a client certificate, and so uses `mtls_endpoint_aliases`.
    private let mutualTLS: Bool
    private let http: UpstreamHTTP
    private let fetcher: @Sendable (String) async throws -> (status: Int, body: Data)
    private var discovered: (endpoints: OIDCEndpoints, at: ContinuousClock.Instant)?
    private var keySet: JWKSCache?
    /// How long a discovery document is used before it is read again.
    static let discoveryLifetime: Duration = .seconds(3600)

    init(settings: OIDCSettings, mutualTLS: Bool = false, http: UpstreamHTTP,
         fetcher: @escaping @Sendable (String) async throws -> (status: Int, body: Data)) {
        self.settings = settings
        self.mutualTLS = mutualTLS
        self.http = http
        self.fetcher = fetcher
    }

    func endpoints() async throws(OAuthError) -> OIDCEndpoints {
        if let endpoints = settings.endpoints { return endpoints }
        if let discovered, ContinuousClock.now - discovered.at < Self.discoveryLifetime { return discovered.endpoints }
        var lastError = OAuthError.upstreamUnavailable("the upstream's discovery document cannot be fetched")
        for attempt in 0..<2 {
            if attempt > 0 { try? await Task.sleep(for: .milliseconds(200)) }
            do throws(OAuthError) {
                let answer = try await http.get(settings.discoveryURL, endpoint: .discovery, purpose: "discovery")
                guard answer.status == 200 else {
                    lastError = answer.status >= 500 || answer.status == 429
                        ? .upstreamUnavailable("the upstream's discovery document is unavailable (HTTP \(answer.status))")
                        : .badUpstream("the upstream's discovery document answered HTTP \(answer.status)")
                    continue
                }
                let endpoints = try OIDCEndpoints.discovered(from: answer.body, issuer: settings.issuer, mutualTLS: mutualTLS)
                discovered = (endpoints, .now)
                return endpoints
            } catch {
                if error.status == 502 { throw error }  // a document that is wrong is not retried
                lastError = error
                if error.timedOut { break }  // waited out once: not twice for the same request
            }
        }
        if let discovered { return discovered.endpoints }  // stale beats none
        throw lastError
    }

    func keys() async throws(OAuthError) -> JWKSCache {
        guard let url = try await endpoints().jwks else {
            throw .badUpstream("the upstream publishes no jwks_uri, so its ID tokens cannot be checked")
        }
        // A new discovery document may name another key set: follow it.
        if let keySet, keySet.url == url { return keySet }
        let cache = JWKSCache(url: url, fetch: fetcher)
        keySet = cache
        return cache
    }
}
