import AsyncHTTPClient
public import Foundation
public import GatehouseCore

extension GatehouseMetrics.Outcome {
    /// How an answer is counted: 1xx–3xx `ok`; a 400 whose OAuth `error` is `invalid_grant`
    /// (RFC 6749 §5.2; `body` is read for a 400 only) `invalid_grant`; other 4xx `4xx`; 5xx `5xx`.
    public init(status: Int, body: Data? = nil) {
        switch status {
        case ..<400:
            self = .ok
        case 400 where body.map(Self.carriesInvalidGrant) == true:
            self = .invalid_grant
        case 400..<500:
            self = .clientError
        default:
            self = .serverError
        }
    }

    /// How a call without a usable answer is counted: `timeout` when the upstream did not answer
    /// in time, `tls` when the TLS handshake failed (a certificate one side does not trust), `5xx`
    /// when its answer was too large to read, `unreachable` otherwise (no connection, or the
    /// connection lost).
    public init(transportError error: any Error) {
        if UpstreamFailure.tlsFailure(error) != nil {
            self = .tls
            return
        }
        switch UpstreamFailure.classify(error, upstream: "").status {
        case 504: self = .timeout
        case 502: self = .serverError
        default: self = .unreachable
        }
    }

    /// Whether the call failed in a way the span marks as an error (the upstream's fault or no answer).
    var isFailure: Bool {
        switch self {
        case .ok, .invalid_grant, .clientError: false
        case .serverError, .timeout, .unreachable, .tls: true
        }
    }

    private static func carriesInvalidGrant(_ body: Data) -> Bool {
        let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        return object?["error"] as? String == "invalid_grant"
    }
}
