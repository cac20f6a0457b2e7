public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import NIOHTTP1

/// The `oauth2` profile: a plain OAuth 2.0 server that requires a client secret
/// (`client_secret_basic` or `client_secret_post`) and may burn refresh tokens after one use.
public struct OAuth2Upstream: UpstreamClient {
    public let settings: UpstreamSettings
    private let httpClient: HTTPClient
    private let logger: Logger

    /// Largest token response read from an upstream.
    static let maximumResponseBytes = 256 * 1024

    public init(settings: UpstreamSettings, httpClient: HTTPClient, logger: Logger) {
        self.settings = settings
        self.httpClient = httpClient
        self.logger = logger
    }

    public func authorizationURL(state: String, redirectURI: String, scopes: [String], codeChallenge: String?) -> String {
        var parameters = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", redirectURI), ("state", state),
        ]
        if !scopes.isEmpty { parameters.append(("scope", scopes.joined(separator: " "))) }
        if let codeChallenge {
            parameters.append(("code_challenge", codeChallenge))
            parameters.append(("code_challenge_method", PKCE.method))
        }
        return RedirectURI.appending(parameters, to: settings.authorizationEndpoint)
    }

    public func exchangeCode(_ code: String, redirectURI: String, codeVerifier: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        var form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURI)]
        if let codeVerifier { form.append(("code_verifier", codeVerifier)) }
        return try await tokenRequest(form, purpose: "code exchange")
    }

    public func refresh(_ refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope { form.append(("scope", scope)) }
        return try await tokenRequest(form, purpose: "refresh")
    }

    public func revoke(_ token: String, hint: String) async {
        guard let endpoint = settings.revocationEndpoint else { return }
        let request = settings.authenticatedForm(url: endpoint, [("token", token), ("token_type_hint", hint)])
        do {
            let (status, _) = try await exchange(request)
            if status != .ok {
                logger.warning("upstream revocation refused", metadata: ["upstream": .string(settings.name), "status": .stringConvertible(status.code)])
            }
        } catch {
            logger.warning("upstream revocation failed", metadata: ["upstream": .string(settings.name)])
        }
    }

    private func tokenRequest(_ parameters: [(String, String)], purpose: String) async throws(OAuthError) -> UpstreamTokenResponse {
        let request = settings.authenticatedForm(url: settings.tokenEndpoint, parameters)
        let status: HTTPResponseStatus
        let bytes: ByteBuffer
        do {
            (status, bytes) = try await exchange(request)
        } catch {
            let mapped = UpstreamFailure.classify(error, upstream: settings.name)
            logger.warning("upstream \(purpose) failed", metadata: [
                "upstream": .string(settings.name), "error": .string(mapped.code), "reason": .string(mapped.detail),
            ])
            throw mapped
        }
        let data = Data(bytes.readableBytesView)
        do throws(OAuthError) {
            return try UpstreamFailure.interpret(status: Int(status.code), body: data)
        } catch {
            logger.warning("upstream \(purpose) refused", metadata: [
                "upstream": .string(settings.name), "status": .stringConvertible(status.code), "error": .string(error.code),
            ])
            throw error
        }
    }

    /// One request to the upstream and its whole answer, within the upstream's `timeout`
    /// (AsyncHTTPClient's own deadline stops at the response head).
    private func exchange(_ request: HTTPClientRequest) async throws -> (HTTPResponseStatus, ByteBuffer) {
        let (httpClient, timeout) = (self.httpClient, settings.timeout)
        return try await withDeadline(timeout, orThrow: { HTTPClientError.deadlineExceeded }) {
            let response = try await httpClient.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
            return (response.status, try await response.body.collect(upTo: Self.maximumResponseBytes))
        }
    }
}
