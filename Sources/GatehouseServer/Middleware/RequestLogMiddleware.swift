import Foundation
import GatehouseCore
import GatehouseRelay
import Hummingbird
import HTTPTypes
import Logging

/// Gives every request Gatehouse's own id (a client's `X-Request-Id` is never taken as it: a
/// plain one is kept as `client_request_id` for correlation), asks for `100 Continue` on the
/// endpoints that read a body, turns any error that escapes a route into problem+json (never
/// a bare 500), and writes one log line per request.
///
/// The log line holds the method, the path and the status: never the query string, which
/// carries codes and states, nor any header.
struct RequestLogMiddleware: RouterMiddleware {
    typealias Context = GatehouseRequestContext
    let logger: Logger
    let routes: [String: [HTTPRequest.Method]]
    let configuration: GatehouseConfiguration

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        let requestID = RequestIDGenerator.shared.next()
        var context = context
        context.requestID = requestID
        context.clientRequestID = request.headers[.requestID].flatMap(RelayForwarding.acceptableClientRequestID)
        // A relayed request asks once its token and rule have passed; the others read their body at once.
        let relayed = configuration.route(for: request.uri.path) != nil
        if !relayed, request.headers[.expect] != nil { await context.sendContinue() }
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            if let allowed = routes[request.uri.path] {
                response = .problem(.methodNotAllowed(), for: request, allow: allowed)
            } else {
                response = .problem(.notFound(), for: request)
            }
        } catch let error as HTTPError where error.status == .contentTooLarge {
            response = .problem(.payloadTooLarge(limit: nil), for: request)
        } catch {
            logger.error("unhandled error", metadata: ["error_type": .string(String(describing: type(of: error)))])
            response = .problem(.badRequest("The request could not be processed."), for: request)
        }
        response.headers[.requestID] = requestID
        let elapsed = ContinuousClock.now - started
        var metadata: Logger.Metadata = [
            "request_id": .string(requestID), "method": .string(request.method.rawValue), "path": .string(request.uri.path),
            "status": .stringConvertible(response.status.code),
            "ms": .string(String(format: "%.1f", Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)),
        ]
        if relayed { metadata["relay"] = "general" }
        if let clientRequestID = context.clientRequestID { metadata["client_request_id"] = .string(clientRequestID) }
        logger.info("request", metadata: metadata)
        return response
    }
}

extension HTTPField.Name {
    static let requestID = HTTPField.Name("X-Request-Id")!
}
