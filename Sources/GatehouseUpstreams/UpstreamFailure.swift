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
        if let error = error as? OAuthError { return error }  // Gatehouse's own refusal, nothing sent
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
        if let failure = tlsFailure(error) {
            // Not an outage: a certificate one side does not trust, which no retry mends. The app
            // can do nothing about it: BoringSSL's reason and the hint are the operator's (`logDetail`).
            return OAuthError.badUpstream(tlsDescription).delivered(failure.beforeRequest ? .unspent : .unknown)
        }
        return OAuthError.upstreamUnavailable("the authorization server cannot be reached").delivered(.unknown)
    }

    /// What an app is told of a failed TLS handshake with its upstream (`error_description`).
    static let tlsDescription = "Gatehouse could not reach the sign-in service securely"

    /// What the log says of a failed call: for a failed TLS handshake BoringSSL's reason and what
    /// it likely means (`ca_file`, the client certificate), which the app is never told; else the
    /// description the app gets.
    static func logDetail(_ error: any Error, mapped: OAuthError) -> String {
        guard let failure = tlsFailure(error) else { return mapped.detail }
        return "the TLS handshake with the authorization server failed (\(failure.reason))\(failure.hint)"
    }

    /// A TLS failure: BoringSSL's reason (such as `TLSV1_ALERT_UNKNOWN_CA` or
    /// `CERTIFICATE_VERIFY_FAILED`), what it likely means, and whether it ended the handshake (so
    /// no request was read). `nil` for any other error; a connection closed without
    /// `close_notify` is a lost connection, not a failed handshake.
    static func tlsFailure(_ error: any Error) -> (reason: String, hint: String, beforeRequest: Bool)? {
        let reason: String
        let beforeRequest: Bool
        switch error {
        case NIOSSLError.handshakeFailed(let boring):
            (reason, beforeRequest) = (Self.reason(of: boring), true)
        case let error as NIOSSLExtraError where error == .failedToValidateHostname:
            return ("the certificate does not name the host", "", true)
        case let boring as BoringSSLError:
            // An alert read after the handshake (TLS 1.3 sends the client-certificate refusal then):
            // the request may have been written, never read.
            (reason, beforeRequest) = (Self.reason(of: boring), false)
        case let error as NIOSSLError where error != .uncleanShutdown:
            (reason, beforeRequest) = (String("\(error)".prefix(64)), false)
        default:
            return nil
        }
        let hint = switch reason {
        case "CERTIFICATE_VERIFY_FAILED": ": its certificate is not trusted (upstreams[].ca_file adds a private CA)"
        case _ where reason.hasPrefix("TLSV1_ALERT_") || reason.hasPrefix("SSLV3_ALERT_"):
            ": it refused the connection, most likely Gatehouse's client certificate (or its absence)"
        default: ""
        }
        return (reason, hint, beforeRequest)
    }

    /// "… error:10000418:SSL routines:OPENSSL_internal:TLSV1_ALERT_UNKNOWN_CA at …/tls_record.cc:491" → its reason.
    private static func reason(of error: BoringSSLError) -> String {
        let text = "\(error)"
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
