import AsyncHTTPClient
import Foundation
import GatehouseCore
import NIOCore

/// Turns what an upstream did into the `OAuthError` the app sees.
enum UpstreamFailure {
    /// A transport failure: no answer at all, or not in time.
    static func classify(_ error: any Error, upstream: String) -> OAuthError {
        if let error = error as? HTTPClientError {
            switch error {
            case .deadlineExceeded, .readTimeout, .writeTimeout:
                return .upstreamTimeout("the authorization server did not answer in time")
            case .connectTimeout, .tlsHandshakeTimeout, .getConnectionFromPoolTimeout:
                return .upstreamUnavailable("the authorization server cannot be reached")
            case .remoteConnectionClosed:
                return .upstreamUnavailable("the authorization server closed the connection")
            default:
                return .upstreamUnavailable("the authorization server cannot be reached")
            }
        }
        if error is NIOTooManyBytesError {
            return .badUpstream("the authorization server's answer is too large")
        }
        return .upstreamUnavailable("the authorization server cannot be reached")
    }

    /// An HTTP answer from a token endpoint: tokens, an OAuth error, or something unusable.
    static func interpret(status: Int, body: Data) throws(OAuthError) -> UpstreamTokenResponse {
        switch status {
        case 200:
            return try UpstreamTokenResponse(body: body)
        case 400, 401:
            let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
            guard let code = object?["error"] as? String else {
                throw .badUpstream("the authorization server answered HTTP \(status) without an OAuth error")
            }
            if let relayed = OAuthError.relayable(fromUpstream: code, detail: object?["error_description"] as? String) {
                throw relayed
            }
            throw .badUpstream("the authorization server refused Gatehouse's request (\(code.prefix(64)))")
        case 429, 502, 503, 504:
            throw .upstreamUnavailable("the authorization server is temporarily unavailable (HTTP \(status))")
        default:
            throw .badUpstream("the authorization server answered HTTP \(status)")
        }
    }
}
