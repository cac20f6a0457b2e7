import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseUpstreams
import Hummingbird
import Logging
import NIOCore

extension AuthorizationServer {
    /// `POST /oauth/token` (RFC 6749 §4.1.3 and §6, RFC 7636 §4.5). Every answer is JSON with
    /// `Cache-Control: no-store`; every failure an RFC 6749 §5.2 error.
    /// `peer`: the connection's address, for the limits counted per client address.
    func token(_ request: Request, peer: String? = nil) async -> Response {
        if let refusal = Self.refusingNonFormBody(request) { return refusal }
        guard let body = await boundedBody(request) else {
            return .problem(.payloadTooLarge(limit: configuration.server.maximumBodyBytes), for: request)
        }
        do throws(OAuthError) {
            let form: FormParameters
            do {
                form = try FormParameters(parsing: body.readableBytesView, recognizing: TokenRequest.parameterNames)
            } catch {
                throw .invalidRequest(error.description)
            }
            let tokenRequest = try TokenRequest.parse(form)
            guard let client = configuration.appClient(for: tokenRequest.clientID), let upstream = upstreams[client.upstream] else {
                throw .invalidClient("no app is registered with this client_id")
            }
            // A proof is checked whenever the app may bind its tokens, the instance its key, or an
            // in-app sign-in its code.
            let proof = client.dpop != .off || client.isInstance || client.inAppSignIn == .on
                ? try await dpop.endpointProof(request, endpoint: "/oauth/token") : nil
            if client.dpop == .required, proof == nil {
                throw .invalidDPoPProof("this app's token requests carry a DPoP proof (RFC 9449)")
            }
            let instances = client.isInstance ? try appInstances() : nil
            let instance = try await instances?.liveInstance(client.clientID, proof: proof).0
            try AppInstances.requireCertification(of: client, instance: instance)
            let binding = client.dpop == .off ? nil : proof?.thumbprint
            let tokens = try await answer(tokenRequest, client: client, upstream: upstream, binding: binding, proven: proof?.thumbprint,
                                          address: limits.clientAddress(peer: peer, headers: request.headers))
            if let instances, let instance, let settings = client.instances { await instances.touch(instance, settings: settings) }
            logger.info("tokens issued", metadata: ["client_id": .string(client.clientID), "grant": .string(tokenRequest.grantName),
                                                    "dpop": .stringConvertible(binding != nil)])
            return .oauthJSON(tokens)
        } catch {
            logger.info("token request refused", metadata: ["error": .string(error.code), "status": .stringConvertible(error.status)])
            return .oauthError(error)
        }
    }

    /// `binding`: the thumbprint of the request's verified DPoP proof, when the app's tokens may be
    /// bound; `proven`: that thumbprint whatever the app's policy (an in-app sign-in's code is bound to it).
    private func answer(_ request: TokenRequest, client: AppClient, upstream: any UpstreamProfile, binding: String?, proven: String?,
                        address: String?) async throws(OAuthError) -> Data
    {
        switch request {
        case .authorizationCode(_, let code, let redirectURI, let codeVerifier, let state):
            // A code of the authorization challenge endpoint comes without redirect_uri, whatever the wiring.
            switch redirectURI == nil ? .callback : client.wiring {
            case .callback:
                let issued = try await redeemGatehouseCode(code, client: client, redirectURI: redirectURI ?? IssuedCode.noRedirectURI,
                                                           codeVerifier: codeVerifier)
                if let bound = issued.dpopJKT, bound != proven {
                    throw .invalidDPoPProof("the code is bound to the DPoP key of its sign-in: the token request must prove that key")
                }
                return try await exposed(SignIn(tokens: issued.tokenResponse, userinfo: issued.userinfo, appNonce: issued.appNonce,
                                                subject: issued.subject), to: client, binding: binding)
            case .relay:
                guard let state, let redirectURI else {
                    throw .invalidRequest("state is required: this app's upstream returns its code to the app (relay mode)")
                }
                let signIn = try await redeemUpstreamCode(code, state: state, client: client, redirectURI: redirectURI,
                                                          codeVerifier: codeVerifier, upstream: upstream)
                return try await exposed(signIn, to: client, binding: binding)
            }
        case .refreshToken(_, let refreshToken, let scope):
            switch try appTokens(for: client) {
            case .minted(let minter, let sessions):
                return try await minter.refresh(refreshToken, clientID: client.clientID, sessions: sessions.minted)
            case .sealed(let sessions):
                return try await sessions.rotateRefreshToken(refreshToken, client: client, binding: binding)
            case .passthrough:
                guard !SessionServices.isGatehouseToken(refreshToken) else {
                    throw .invalidGrant("the refresh token is invalid, expired or revoked")
                }
                let tokens = try await passthrough.refresh(refreshToken, scope: scope, client: client, upstream: upstream) {
                    () throws(OAuthError) in try admitUnknownRefreshToken(client: client, address: address)
                }
                // Passthrough tokens name nobody Gatehouse has verified: no subject.
                audit.record(.refresh, clientID: client.clientID, subject: nil, metadata: ["upstream": .string(client.upstream)])
                return tokens
            }
        }
    }

    /// A passthrough refresh token Gatehouse has no record of (the refresher reads the record)
    /// costs an upstream call that may come to nothing (junk): refused outright under
    /// `unknown_refresh_tokens: refuse`, and otherwise limited per client address
    /// (`rate_limits.unknown_refresh_per_address`), so that nobody turns made-up tokens into
    /// upstream load, or into a 429 that backs off every user.
    private func admitUnknownRefreshToken(client: AppClient, address: String?) throws(OAuthError) {
        if client.unknownRefreshTokens == .refuse {
            throw .invalidGrant("the refresh token is invalid, expired or revoked")
        }
        if let address, let wait = limits.take(.unknown_refresh_address, key: address, clientID: client.clientID) {
            throw .rateLimited(retryAfter: wait.retryAfterSeconds)
        }
    }

    /// A completed sign-in on its way to the app: the upstream's token response, the verified
    /// userinfo, the app's nonce, and who signed in (the validated ID token's `sub`).
    struct SignIn {
        let tokens: Data
        let userinfo: Data?
        let appNonce: String?
        let subject: String?
    }

    /// The upstream's tokens as the client's `token_exposure` says: as they are, or sealed behind Gatehouse's pair.
    private func exposed(_ signIn: SignIn, to client: AppClient, binding: String?) async throws(OAuthError) -> Data {
        let tokens: Data
        switch try appTokens(for: client) {
        case .minted(let minter, let sessions):
            // Gatehouse mints this app's tokens: the sign-in proved who it is, nothing more.
            return try await minter.signedIn(userinfo: signIn.userinfo, clientID: client.clientID, sessions: sessions.minted)
        case .passthrough:
            await passthrough.bind(signIn.tokens, to: client)
            tokens = signIn.tokens
        case .sealed(let sessions):
            tokens = try await sessions.beginSession(client: client, signIn: signIn, dpopJKT: binding)
        }
        audit.record(.sign_in, clientID: client.clientID, subject: signIn.subject, metadata: [
            "upstream": .string(client.upstream), "token_exposure": .string(client.tokenExposure.rawValue),
        ])
        return tokens
    }

    /// Callback mode: the code is Gatehouse's own; it is consumed before anything is checked,
    /// so a wrong verifier burns it (RFC 6749 §4.1.2: a code is used at most once).
    private func redeemGatehouseCode(_ code: String, client: AppClient, redirectURI: String, codeVerifier: String)
        async throws(OAuthError) -> IssuedCode
    {
        let sealed: Data?
        do {
            sealed = try await store.consumeCode(codeHash: SecureToken.hash(code), now: now())
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        guard let sealed, let issued = try? IssuedCode.unsealed(sealed, with: code) else {
            throw .invalidGrant("the code is invalid, expired or already used")
        }
        guard issued.clientID == client.clientID else { throw .invalidGrant("the code was issued to another app") }
        guard issued.redirectURI == redirectURI else {
            if redirectURI == IssuedCode.noRedirectURI { throw .invalidRequest("redirect_uri is required") }
            throw .invalidGrant(issued.redirectURI == IssuedCode.noRedirectURI
                ? "the code is of an in-app sign-in: its token request carries no redirect_uri"
                : "redirect_uri differs from the one of the authorization request")
        }
        guard PKCE.verify(codeVerifier: codeVerifier, codeChallenge: issued.codeChallenge) else {
            throw .invalidGrant("code_verifier does not match the code_challenge")
        }
        return issued
    }

    /// Relay mode: the app holds the upstream's code and Gatehouse's state. The transaction is
    /// consumed and PKCE checked before the code goes anywhere near the upstream.
    private func redeemUpstreamCode(_ code: String, state: String, client: AppClient, redirectURI: String,
                                    codeVerifier: String, upstream: any UpstreamProfile) async throws(OAuthError) -> SignIn
    {
        let transaction: AuthorizationTransaction?
        do {
            transaction = try await consumeTransaction(state: state, wiring: .relay)
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        guard let transaction, transaction.wiring == .relay else {
            throw .invalidGrant("the state is unknown, expired or already used")
        }
        guard transaction.clientID == client.clientID else { throw .invalidGrant("the state belongs to another app") }
        guard transaction.redirectURI == redirectURI else {
            throw .invalidGrant("redirect_uri differs from the one of the authorization request")
        }
        guard PKCE.verify(codeVerifier: codeVerifier, codeChallenge: transaction.codeChallenge) else {
            throw .invalidGrant("code_verifier does not match the code_challenge")
        }
        let grant = try await upstream.completeAuthorization(code: code, redirectURI: redirectURI, memo: transaction.memo,
                                                             appCodeVerifier: codeVerifier)
        return SignIn(tokens: grant.tokens?.json ?? Data("{}".utf8), userinfo: grant.userinfo, appNonce: transaction.appNonce, subject: grant.subject)
    }
}

extension TokenRequest {
    var grantName: String {
        switch self {
        case .authorizationCode: "authorization_code"
        case .refreshToken: "refresh_token"
        }
    }
}
