import Foundation
import GatehouseCore
import Logging

/// The seed's `/auth/*` endpoints (broccoliapps' `framework/shared/src/auth.ts`), for apps built
/// against that contract: Gatehouse is their backend, for a `central` upstream's `app_api`.
extension CentralUpstream {
    enum Endpoint: String, CaseIterable {
        case exchange, refresh
        case sendMagicLink = "send-magic-link"
        case verifyApple = "verify-apple"
    }

    /// `{app_api.path}/{endpoint}` for each endpoint, when `app_api` is configured.
    public var appRoutes: [AppRoute] {
        guard let api = central.appAPI else { return [] }
        return Endpoint.allCases.map { endpoint in
            AppRoute(path: api.path + "/" + endpoint.rawValue) { request, sessions in
                await appAPI(request, endpoint: endpoint, clientID: api.clientID, sessions: sessions)
            }
        }
    }

    func appAPI(_ request: AppRequest, endpoint: Endpoint, clientID: String, sessions: any MintedSessions) async -> AppResponse {
        let logger = sessions.logger
        do throws(CentralAPIError) {
            switch endpoint {
            case .exchange:
                let body = try CentralAPIRequest(request, fields: [("code", .string(maximum: 1024), true)])
                let user: CentralUser
                do throws(CentralFailure) {
                    user = try await client.verify(code: body["code"] ?? "")
                } catch {
                    throw Self.apiError(error)
                }
                return try await signedIn(user, clientID: clientID, sessions: sessions)
            case .refresh:
                let body = try CentralAPIRequest(request, fields: [("refreshToken", .string(maximum: 1024), true)])
                let pair: CentralPair
                do throws(OAuthError) {
                    pair = try await centralMinter.rotate(body["refreshToken"] ?? "", clientID: clientID, sessions: sessions)
                } catch where error.code == "invalid_grant" {
                    throw CentralAPIError(status: 403, message: "Invalid refresh token")
                } catch {
                    throw Self.apiError(error)
                }
                return Self.answer(pair)
            case .sendMagicLink:
                let body = try CentralAPIRequest(request, fields: [("email", .email, true), ("platform", .word(["mobile"]), false)])
                let email = body["email"] ?? ""
                if let refusal = magicLinks.admit(email, clientAddress: request.clientAddress, now: sessions.now) {
                    logger.notice("magic link refused: too many this hour", metadata: [
                        "upstream": .string(settings.name), "limit": .string(refusal.limit.rawValue),
                    ])
                    throw CentralAPIError(status: 429, message: "Too many requests. Please try again later.", retryAfter: refusal.retryAfter)
                }
                do throws(CentralFailure) {
                    try await client.sendMagicLink(email: email, platform: body["platform"])
                } catch {
                    throw Self.apiError(error)
                }
                return AppResponse(status: 200, json: JSONCoding.encode(["success": true]))
            case .verifyApple:
                return try await verifyApple(request, clientID: clientID, sessions: sessions)
            }
        } catch {
            if error.status >= 500 || error.status == 429 {
                logger.warning("central api request failed", metadata: ["endpoint": .string(endpoint.rawValue), "status": .stringConvertible(error.status)])
            } else {
                logger.info("central api request refused", metadata: ["endpoint": .string(endpoint.rawValue), "status": .stringConvertible(error.status)])
            }
            return error.response
        }
    }

    /// `POST /auth/verify-apple`: Apple's identity token checked here, then the central user from
    /// `verify-native` (the name from `fullName`, which Apple sends only at the first sign-in, else
    /// from the address, as the seed derives it).
    private func verifyApple(_ request: AppRequest, clientID: String, sessions: any MintedSessions) async throws(CentralAPIError) -> AppResponse {
        let logger = sessions.logger
        let body = try CentralAPIRequest(request, fields: [
            ("identityToken", .string(maximum: 8192), true), ("authorizationCode", .string(maximum: 1024), true),
            ("user", .string(maximum: 256), true), ("fullName", .personName, false), ("nonce", .string(maximum: 256), false),
        ])
        guard let apple else {
            throw CentralAPIError(status: 404, message: "Sign in with Apple is not configured for this app")
        }
        let identity: AppleIdentityVerifier.Identity
        do throws(JOSEError) {
            identity = try await apple.verify(body["identityToken"] ?? "", user: body["user"] ?? "", nonce: body["nonce"], now: sessions.now)
        } catch where error.unavailable {
            logger.warning("Apple's key set cannot be fetched", metadata: ["reason": .string(error.detail)])
            throw CentralAPIError(status: 503, message: "Service Unavailable", retryAfter: 5)
        } catch {
            logger.info("Apple identity token refused", metadata: ["check": .string(error.check)])
            throw CentralAPIError(status: 401, message: "Invalid Apple identity token", details: ["\(error.check): \(error.detail)"])
        }
        // Single use, in the store (every instance, across restarts), until the token's own expiry.
        let firstUse: Bool
        do {
            firstUse = try await sessions.insertOnce(kind: Self.appleIdentityTokenKind, keyHash: SecureToken.hash(body["identityToken"] ?? ""),
                                                     expiresAt: identity.expiresAt)
        } catch {
            logger.error("the store could not record an Apple identity token's use", metadata: ["upstream": .string(settings.name)])
            throw CentralAPIError(status: 503, message: "Service Unavailable", retryAfter: 5)
        }
        guard firstUse else {
            logger.notice("security event: an Apple identity token was presented again", metadata: ["upstream": .string(settings.name)])
            throw CentralAPIError(status: 401, message: "Invalid Apple identity token", details: ["replay: this identity token was already used"])
        }
        let fullName = body.values["fullName"] as? [String: Any]
        let parts = [fullName?["givenName"] as? String, fullName?["familyName"] as? String].compactMap { $0 }.filter { !$0.isEmpty }
        let name = parts.isEmpty ? String(identity.email.split(separator: "@").first ?? "User") : parts.joined(separator: " ")
        var user: CentralUser
        do throws(CentralFailure) {
            user = try await client.verifyNative(email: identity.email, name: name)
        } catch {
            throw Self.apiError(error)
        }
        // This sign-in was Apple's, whatever the central user was first created with (as the seed's backend mints it).
        user.provider = "apple"
        return try await signedIn(user, clientID: clientID, sessions: sessions)
    }

    /// The single-use kind of a Sign in with Apple identity token taken by `verify-apple`.
    static let appleIdentityTokenKind = "apple_identity_token"

    /// The seed's token answer: `{accessToken, accessTokenExpiresAt, refreshToken, refreshTokenExpiresAt, user}`;
    /// `user` carries both the seed's app shape (`id`, `isNewUser`) and the central one (`userId`, `provider`).
    private static func answer(_ pair: CentralPair) -> AppResponse {
        struct User: Encodable {
            let id: String
            let userId: String
            let email: String
            let name: String
            let provider: String
            let isNewUser: Bool
        }
        struct Body: Encodable {
            let accessToken: String
            let accessTokenExpiresAt: Int64
            let refreshToken: String
            let refreshTokenExpiresAt: Int64
            let user: User
        }
        let user = pair.user
        return AppResponse(status: 200, headers: [("Pragma", "no-cache")], json: JSONCoding.encode(Body(
            accessToken: pair.accessToken, accessTokenExpiresAt: pair.accessTokenExpiresAt, refreshToken: pair.refreshToken,
            refreshTokenExpiresAt: pair.refreshTokenExpiresAt,
            user: User(id: user.userId, userId: user.userId, email: user.email, name: user.name, provider: user.provider,
                       isNewUser: pair.isNewUser))))
    }

    private func signedIn(_ user: CentralUser, clientID: String, sessions: any MintedSessions) async throws(CentralAPIError) -> AppResponse {
        do throws(OAuthError) {
            return Self.answer(try await centralMinter.beginSession(user: user, clientID: clientID, sessions: sessions))
        } catch {
            throw Self.apiError(error)
        }
    }

    private static func apiError(_ failure: CentralFailure) -> CentralAPIError {
        switch failure {
        case .codeNotFound: CentralAPIError(status: 404, message: "Auth code not found")
        case .rateLimited(let seconds): CentralAPIError(status: 429, message: "Too many requests. Please try again later.", retryAfter: seconds)
        case .upstream(let error): apiError(error)
        }
    }

    private static func apiError(_ error: OAuthError) -> CentralAPIError {
        switch error.status {
        case 503: CentralAPIError(status: 503, message: "Service Unavailable", retryAfter: error.retryAfter ?? 5)
        case 504: CentralAPIError(status: 504, message: "Gateway Timeout")
        case 400..<500: CentralAPIError(status: error.status, message: error.detail)
        default: CentralAPIError(status: 502, message: "Bad Gateway")
        }
    }
}
