import AsyncHTTPClient
import Foundation
import GatehouseCore
import NIOCore
import NIOPosix
import NIOSSL

/// Turns what an upstream did into the `OAuthError` the app sees.
enum UpstreamFailure {
    /// A transport failure: no answer at all, or not in time.
    static func classify(_ error: any Error, upstream: String) -> OAuthError {
        if let error = error as? HTTPClientError {
            switch error {
            case .deadlineExceeded, .readTimeout, .writeTimeout:
                return OAuthError.upstreamTimeout("the authorization server did not answer in time").delivered(.unknown)
            case .connectTimeout, .tlsHandshakeTimeout, .getConnectionFromPoolTimeout:
                // No connection, so no request: nothing was spent; but the whole connect timeout was.
                return OAuthError.upstreamUnavailable("the authorization server cannot be reached").delivered(.unspent, timedOut: true)
            case .remoteConnectionClosed:
                return OAuthError.upstreamUnavailable("the authorization server closed the connection").delivered(.unknown)
            default:
                return OAuthError.upstreamUnavailable("the authorization server cannot be reached").delivered(.unknown)
            }
        }
        // Refused connections only: ENETUNREACH and EHOSTUNREACH can also end an established socket.
        if error is NIOConnectionError || (error as? IOError)?.errnoCode == ECONNREFUSED {
            return OAuthError.upstreamUnavailable("the authorization server cannot be reached").delivered(.unspent)
        }
        if error is NIOTooManyBytesError {
            return .badUpstream("the authorization server's answer is too large")
        }
        if let reason = tlsFailure(error) {
            // Not an outage: a certificate one side does not trust, which no retry mends. The
            // handshake failed before the upstream read a request.
            return OAuthError.badUpstream("the TLS handshake with the authorization server failed (\(reason)): it refused Gatehouse's "
                                          + "client certificate, or its own certificate is not trusted (ca_file)").delivered(.unspent)
        }
        return OAuthError.upstreamUnavailable("the authorization server cannot be reached").delivered(.unknown)
    }

    /// The reason of a failed TLS handshake (BoringSSL's, such as `TLSV1_ALERT_UNKNOWN_CA` or
    /// `CERTIFICATE_VERIFY_FAILED`), or `nil` for any other error. A connection closed without
    /// `close_notify` is a lost connection, not a handshake that failed.
    static func tlsFailure(_ error: any Error) -> String? {
        let boring: BoringSSLError
        switch error {
        case let error as BoringSSLError: boring = error
        case NIOSSLError.handshakeFailed(let error): boring = error
        case let error as NIOSSLError where error != .uncleanShutdown: return "\(error)".prefix(64).description
        case let error as NIOSSLExtraError: return "\(error)".prefix(64).description
        default: return nil
        }
        // "… error:10000418:SSL routines:OPENSSL_internal:TLSV1_ALERT_UNKNOWN_CA at …/tls_record.cc:491"
        let text = "\(boring)"
        guard let range = text.range(of: "OPENSSL_internal:") else { return "handshake refused" }
        return String(text[range.upperBound...].prefix { $0.isLetter || $0.isNumber || $0 == "_" })
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
        case 429, 503:
            // RFC 9110 §15.6.4 / RFC 6585 §4: the server did not act on the request.
            throw OAuthError.upstreamUnavailable("the authorization server is temporarily unavailable (HTTP \(status))").delivered(.unspent)
        case 502, 504:
            // A gateway in front of the upstream: the upstream itself may have acted.
            throw OAuthError.upstreamUnavailable("the authorization server is temporarily unavailable (HTTP \(status))").delivered(.unknown)
        default:
            throw OAuthError.badUpstream("the authorization server answered HTTP \(status)").delivered(status >= 500 ? .unknown : .notUpstream)
        }
    }
}
