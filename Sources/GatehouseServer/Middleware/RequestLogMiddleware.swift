import Foundation
import GatehouseCore
import Hummingbird
import HTTPTypes
import Logging

/// Gives every request an id (kept from `X-Request-Id` when well-formed), turns any error that
/// escapes a route into problem+json (never a bare 500), and writes one log line per request.
///
/// The log line holds the method, the path and the status: never the query string, which
/// carries codes and states, nor any header.
struct RequestLogMiddleware: RouterMiddleware {
    typealias Context = GatehouseRequestContext
    let logger: Logger
    let routes: [String: [HTTPRequest.Method]]

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        let requestID = request.headers[.requestID].flatMap(Self.acceptable) ?? RequestIDGenerator.shared.next()
        var context = context
        context.requestID = requestID
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
        logger.info("request", metadata: [
            "request_id": .string(requestID), "method": .string(request.method.rawValue), "path": .string(request.uri.path),
            "status": .stringConvertible(response.status.code),
            "ms": .string(String(format: "%.1f", Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)),
        ])
        return response
    }

    /// A client's request id is kept only when it is short and plain.
    static func acceptable(_ value: String) -> String? {
        guard (1...64).contains(value.utf8.count),
              value.utf8.allSatisfy({ $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".")
                  || (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0) })
        else { return nil }
        return value
    }
}

extension HTTPField.Name {
    static let requestID = HTTPField.Name("X-Request-Id")!
}
