public import AsyncHTTPClient
public import CoreMetrics
import Foundation
public import GatehouseCore
import GatehouseUpstreams
import NIOCore
import NIOHTTP1
import NIOSSL

/// The calls to one identity service: at most `identity_concurrency` in flight and as many
/// waiting their turn; beyond that a call fails at once with `IdentityUnavailable(.overloaded)`,
/// nothing sent (the relay answers 503 with `Retry-After: 1`). Each call is counted and timed as
/// the upstream's `identity` endpoint and traced as `identity <upstream>`, `traceparent` injected.
///
/// One per resolver, so one limit per identity service.
struct IdentityHTTP: Sendable {
    /// One request: status and body (at most `maximumResponseBytes`), within the timeout.
    typealias Transport = @Sendable (HTTPClientRequest, Duration) async throws -> (status: Int, body: Data)

    static let maximumResponseBytes = 256 * 1024

    let timeout: Duration
    let limit: ConcurrencyLimit
    let telemetry: UpstreamTelemetry
    let transport: Transport
    private let spanName: String

    /// `tls`: the upstream's `ca_file` and mutual-TLS certificate, on every call (a token the
    /// upstream bound to the certificate is only accepted with it, RFC 8705 §3).
    init(upstream: String, timeout: Duration, concurrency: Int, client: HTTPClient, tls: TLSConfiguration? = nil) {
        self.init(upstream: upstream, timeout: timeout, limit: ConcurrencyLimit(limit: concurrency),
                  transport: Self.transport(over: client, tls: tls))
    }

    /// - Parameter metrics: `nil` counts in the process's metrics; tests hand in their own factory.
    init(upstream: String, timeout: Duration, limit: ConcurrencyLimit, metrics: (any MetricsFactory)? = nil,
         transport: @escaping Transport) {
        self.timeout = timeout
        self.limit = limit
        self.telemetry = UpstreamTelemetry(upstream: upstream, metrics: metrics)
        self.transport = transport
        self.spanName = "identity " + upstream
    }

    /// One request to the identity service: status and body, or why there is none.
    func send(_ request: HTTPClientRequest) async throws(IdentityUnavailable) -> (status: Int, body: Data) {
        let answer: Result<(status: Int, body: Data), IdentityUnavailable>
        do {
            answer = try await limit.withPermit { await exchange(request) }
        } catch is ConcurrencyLimit.Full {
            telemetry.rateLimited(.identity_concurrency)
            throw IdentityUnavailable(.overloaded, "too many identity calls are in flight toward this identity service")
        } catch {
            // Cancelled while waiting for a permit: nothing was sent.
            throw IdentityUnavailable(.unreachable, "the identity call was cancelled before it was sent")
        }
        return try answer.get()
    }

    private func exchange(_ request: HTTPClientRequest) async -> Result<(status: Int, body: Data), IdentityUnavailable> {
        let (transport, timeout) = (self.transport, self.timeout)
        do {
            return .success(try await telemetry.call(.identity, spanName: spanName, request, classify: { (answer: (status: Int, body: Data)) in
                (GatehouseMetrics.Outcome(status: answer.status), answer.status)
            }, send: { request in
                try await transport(request, timeout)
            }))
        } catch let error as HTTPClientError where [.deadlineExceeded, .readTimeout].contains(error) {
            return .failure(IdentityUnavailable(.timeout, "the identity service did not answer in time"))
        } catch is NIOTooManyBytesError {
            return .failure(IdentityUnavailable(.badResponse, "the identity service's answer is too large"))
        } catch {
            return .failure(IdentityUnavailable(.unreachable, "the identity service cannot be reached"))
        }
    }

    static func transport(over client: HTTPClient, tls: TLSConfiguration? = nil) -> Transport {
        { request, timeout in
            var request = request
            if let tls { request.tlsConfiguration = tls }
            let response = try await client.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
            let body = try await response.body.collect(upTo: maximumResponseBytes)
            return (Int(response.status.code), Data(body.readableBytesView))
        }
    }

    static func json(_ body: Data) throws(IdentityUnavailable) -> [String: Any] {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] else {
            throw IdentityUnavailable(.badResponse, "the identity service's answer is not a JSON object")
        }
        return object
    }
}
