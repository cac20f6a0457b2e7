public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import Logging
import NIOCore
import NIOHTTP1

/// Gatehouse's exchanges with one upstream, whatever its kind: token requests with its client
/// credentials, revocations, and plain reads (discovery, JWKS, userinfo), each bounded by the
/// upstream's `timeout`, body included.
public struct UpstreamHTTP: Sendable {
    public let settings: UpstreamSettings
    let httpClient: HTTPClient
    public let logger: Logger

    /// Largest answer read from an upstream.
    static let maximumResponseBytes = 256 * 1024

    public init(settings: UpstreamSettings, httpClient: HTTPClient, logger: Logger) {
        self.settings = settings
        self.httpClient = httpClient
        self.logger = logger
    }

    /// A token-endpoint request (code, refresh) and its checked answer.
    func tokenRequest(url: String, _ parameters: [(String, String)], purpose: String) async throws(OAuthError) -> UpstreamTokenResponse {
        let request = settings.authenticatedForm(url: url, parameters)
        let (status, data) = try await send(request, purpose: purpose)
        do throws(OAuthError) {
            return try UpstreamFailure.interpret(status: status, body: data)
        } catch {
            logger.warning("upstream \(purpose) refused", metadata: [
                "upstream": .string(settings.name), "status": .stringConvertible(status), "error": .string(error.code),
            ])
            throw error
        }
    }

    /// The authorization-code grant (RFC 6749 §4.1.3), with the PKCE verifier the sign-in's memo calls for.
    func exchangeCode(url: String, code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamTokenResponse
    {
        var form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURI)]
        if let verifier = memo.forwardsAppVerifier ? appCodeVerifier : memo.codeVerifier { form.append(("code_verifier", verifier)) }
        return try await tokenRequest(url: url, form, purpose: "code exchange")
    }

    /// The refresh-token grant (RFC 6749 §6).
    func refresh(url: String, refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope { form.append(("scope", scope)) }
        return try await tokenRequest(url: url, form, purpose: "refresh")
    }

    /// RFC 7009 revocation, best effort: failures are logged, never thrown.
    func revoke(url: String, token: String, hint: String) async {
        let request = settings.authenticatedForm(url: url, [("token", token), ("token_type_hint", hint)])
        do {
            let (status, _) = try await exchange(request)
            if status != .ok {
                logger.warning("upstream revocation refused", metadata: ["upstream": .string(settings.name), "status": .stringConvertible(status.code)])
            }
        } catch {
            logger.warning("upstream revocation failed", metadata: ["upstream": .string(settings.name)])
        }
    }

    /// A GET (with a bearer token when given): status, content type and body. Transport
    /// failures are thrown as the app should see them.
    func get(_ url: String, bearer: String? = nil, accept: String = "application/json", purpose: String)
        async throws(OAuthError) -> (status: Int, contentType: String?, body: Data)
    {
        var request = HTTPClientRequest(url: url)
        request.headers.add(name: "Accept", value: accept)
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer " + bearer) }
        let response: (HTTPResponseStatus, HTTPHeaders, ByteBuffer)
        do {
            response = try await exchangeWithHeaders(request)
        } catch {
            let mapped = UpstreamFailure.classify(error, upstream: settings.name)
            logger.warning("upstream \(purpose) failed", metadata: [
                "upstream": .string(settings.name), "error": .string(mapped.code), "reason": .string(mapped.detail),
            ])
            throw mapped
        }
        return (Int(response.0.code), response.1.first(name: "Content-Type"), Data(response.2.readableBytesView))
    }

    /// A request and its status and body, transport failures mapped for the app.
    func send(_ request: HTTPClientRequest, purpose: String) async throws(OAuthError) -> (status: Int, body: Data) {
        let (status, _, body) = try await sendWithHeaders(request, purpose: purpose)
        return (status, body)
    }

    /// A request and its status, headers and body, transport failures mapped for the app.
    func sendWithHeaders(_ request: HTTPClientRequest, purpose: String) async throws(OAuthError) -> (status: Int, headers: HTTPHeaders, body: Data) {
        do {
            let (status, headers, bytes) = try await exchangeWithHeaders(request)
            return (Int(status.code), headers, Data(bytes.readableBytesView))
        } catch {
            let mapped = UpstreamFailure.classify(error, upstream: settings.name)
            logger.warning("upstream \(purpose) failed", metadata: [
                "upstream": .string(settings.name), "error": .string(mapped.code), "reason": .string(mapped.detail),
            ])
            throw mapped
        }
    }

    /// One request to the upstream and its whole answer, within the upstream's `timeout`
    /// (AsyncHTTPClient's own deadline stops at the response head).
    func exchange(_ request: HTTPClientRequest) async throws -> (HTTPResponseStatus, ByteBuffer) {
        let (status, _, body) = try await exchangeWithHeaders(request)
        return (status, body)
    }

    private func exchangeWithHeaders(_ request: HTTPClientRequest) async throws -> (HTTPResponseStatus, HTTPHeaders, ByteBuffer) {
        let (httpClient, timeout) = (self.httpClient, settings.timeout)
        return try await withDeadline(timeout, orThrow: { HTTPClientError.deadlineExceeded }) {
            let response = try await httpClient.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
            return (response.status, response.headers, try await response.body.collect(upTo: Self.maximumResponseBytes))
        }
    }
}
