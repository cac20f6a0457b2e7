import Foundation
import GatehouseCore
import GatehouseRelay
import Hummingbird
import HTTPTypes
import Logging
import Tracing

/// Gives every request Gatehouse's own id (a client's `X-Request-Id` is never taken as it: a
/// plain one is kept as `client_request_id` for correlation), asks for `100 Continue` on the
/// endpoints that read a body, turns any error that escapes a route into problem+json (never
/// a bare 500), writes one log line per request, counts it (`gatehouse_http_requests_total`,
/// the duration histogram, `gatehouse_relay_requests_total{path="general"}`) and wraps it in a
/// server span `HTTP <METHOD> <route label>` whose parent is the request's `traceparent`. An
/// answer to a request with a DPoP proof carries the current server nonce when nonces are
/// required (`DPoPEnforcement.announcedNonce`).
///
/// While the route runs, `RequestScope.requestID` holds the request id (every log line carries
/// it) and the span's context is the current `ServiceContext` (outbound spans are its children).
///
/// Durations (log line, histogram, span) run from the request's head to the answer's head.
///
/// The log line holds the method, the path and the status: never the query string, which
/// carries codes and states, nor any header. Span attributes hold the route label, never the path.
struct RequestLogMiddleware<Context: GatehouseRequestContextProtocol>: RouterMiddleware {
    let logger: Logger
    /// Gatehouse's own endpoints and their methods (their paths are route labels).
    let routes: [String: [HTTPRequest.Method]]
    /// The `Gatehouse` in force (its relayed routes; a reload swaps it).
    let holder: GatehouseHolder
    /// Where the request's line goes.
    var accessLog: AccessLog = .throughLogger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        let requestID = RequestIDGenerator.shared.next()
        var context = context
        context.requestID = requestID
        context.clientRequestID = request.headers[.requestID].flatMap(RelayForwarding.acceptableClientRequestID)
        let relayRoute = holder.current.configuration.route(for: request.uri.path)
        let route = RouteLabel.of(path: request.uri.path, endpoints: routes, relayed: relayRoute)
        let span = Self.startServerSpan(request, route: route, requestID: requestID)
        return await RequestScope.$requestID.withValue(requestID) {
            await ServiceContext.$current.withValue(span.context) {
                // A relayed request asks once its token and rule have passed; the others read their body at once.
                if relayRoute == nil, request.headers[.expect] != nil { await context.sendContinue() }
                var response = await respond(request, context: context, next: next)
                response.headers[.requestID] = requestID
                if response.headers[DPoPEnforcement.nonceHeader] == nil, let nonce = holder.current.dpop.announcedNonce(for: request) {
                    response.headers[DPoPEnforcement.nonceHeader] = nonce
                }
                let status = Int(response.status.code)
                span.updateAttributes { $0["http.response.status_code"] = status }
                if status >= 500 { span.setStatus(SpanStatus(code: .error)) }
                let relayed = relayRoute != nil
                log(request, context: context, status: status, relayed: relayed, elapsed: ContinuousClock.now - started)
                // Counted and ended at the answer's head, as the log line is. Wrapping the body to
                // wait for its last byte would turn every buffered answer into a streamed one: its
                // end would reach the connection after the bytes, and a request the app sends right
                // after reading them could find the answer still owed (the fast path then declines it).
                RequestMetrics.record(route: route, method: request.method.rawValue, status: status, relayed: relayed,
                                      elapsed: ContinuousClock.now - started)
                span.end()
                return response
            }
        }
    }

    /// The route's answer; an error that escapes it becomes problem+json.
    private func respond(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            if let allowed = routes[request.uri.path] {
                return .problem(.methodNotAllowed(), for: request, allow: allowed)
            }
            return .problem(.notFound(), for: request)
        } catch let error as HTTPError where error.status == .contentTooLarge {
            return .problem(.payloadTooLarge(limit: nil), for: request)
        } catch {
            logger.error("unhandled error", metadata: ["error_type": .string(String(describing: type(of: error)))])
            return .problem(.badRequest("The request could not be processed."), for: request)
        }
    }

    private func log(_ request: Request, context: Context, status: Int, relayed: Bool, elapsed: Duration) {
        let (seconds, attoseconds) = elapsed.components
        let line = RequestLine(requestID: context.requestID, method: request.method.rawValue, path: request.uri.path, status: status,
                               nanoseconds: seconds * 1_000_000_000 + attoseconds / 1_000_000_000, relay: relayed ? .general : nil,
                               clientRequestID: context.clientRequestID)
        accessLog.record(line, logger: logger, extra: AccessLog.extra(of: logger))
    }

    /// The request's server span, child of the request's `traceparent` when it has one.
    /// A no-op span (no allocation of note) while tracing is off.
    static func startServerSpan(_ request: Request, route: String, requestID: String) -> any Span {
        var parent = ServiceContext.current ?? .topLevel
        InstrumentationSystem.instrument.extract(request.headers, into: &parent, using: HTTPFieldsExtractor())
        let span = startSpan("HTTP \(request.method.rawValue) \(route)", context: parent, ofKind: .server)
        span.updateAttributes { attributes in
            attributes["http.request.method"] = request.method.rawValue
            attributes["http.route"] = route
            attributes["gatehouse.request_id"] = requestID
        }
        return span
    }
}

extension HTTPField.Name {
    static let requestID = HTTPField.Name("X-Request-Id")!
}
