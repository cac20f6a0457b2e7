import GatehouseCore
import Hummingbird
import HTTPTypes
import NIOCore

/// `rate_limits.oauth_per_address` and `oauth_per_client` on `/oauth/*`: a request over either
/// bucket is answered 429 with `Retry-After` before any route sees it, counted
/// (`gatehouse_rate_limited_total`) and audited (`rate_limited`).
///
/// The client is the `client_id` of the query (authorize, logout) or of the form body (token,
/// revoke). The body is read here, bounded by `server.max_body_bytes` exactly as the routes
/// read it, and handed on buffered (`collectBody` keeps it in the request), so the route reads
/// the same bytes: one place decides every `/oauth/*` limit, before the store or an upstream
/// is touched. Only registered client ids are counted: unknown ones are refused by the routes
/// anyway, and must not push real apps' buckets out of the limiter.
struct RateLimitMiddleware<Context: GatehouseRequestContextProtocol>: RouterMiddleware {
    let holder: GatehouseHolder

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let gatehouse = holder.current
        let limits = gatehouse.limits
        // The router's form of the path: `//oauth//token/` reaches /oauth/token, so it is limited as it.
        let path = RouteLabel.routerPath(request.uri.path)
        guard path.hasPrefix("/oauth/"), limits.oauthPerAddress != nil || limits.oauthPerClient != nil else {
            return try await next(request, context)
        }
        // The address first: an address over its limit is refused before its body is read.
        if limits.oauthPerAddress != nil, let address = limits.clientAddress(peer: context.remoteAddress, headers: request.headers),
           let wait = limits.take(.oauth_address, key: address) {
            return Self.refuse(request, path: path, wait: wait)
        }
        guard limits.oauthPerClient != nil else { return try await next(request, context) }
        var request = request
        let clientID: String?
        switch await Self.clientID(of: &request, path: path, limit: gatehouse.configuration.server.maximumBodyBytes) {
        case .found(let found):
            // An instance counts against its app: instance ids are free to make up, buckets are not.
            clientID = found.map { InstanceID.split($0)?.app ?? $0 }.flatMap { gatehouse.configuration.clients[$0] == nil ? nil : $0 }
        case .bodyTooLarge: return .problem(.payloadTooLarge(limit: gatehouse.configuration.server.maximumBodyBytes), for: request)
        }
        if let clientID, let wait = limits.take(.oauth_client, key: clientID, clientID: clientID) {
            return Self.refuse(request, path: path, wait: wait)
        }
        return try await next(request, context)
    }

    /// The 429: OAuth JSON on the endpoints apps call directly (RFC 6749 §5.2), the error page
    /// (or problem JSON, as `Accept` says) on the browser's endpoints.
    private static func refuse(_ request: Request, path: String, wait: Duration) -> Response {
        let seconds = wait.retryAfterSeconds
        guard answersOAuthJSON(path) else { return .tooManyRequests(retryAfter: seconds, for: request) }
        return .oauthError(.rateLimited(retryAfter: seconds))
    }

    static func answersOAuthJSON(_ path: String) -> Bool {
        ["/oauth/token", "/oauth/revoke", "/oauth/register", "/oauth/attestation/challenge", "/oauth/attestation",
         "/oauth/session_code"].contains(path)
    }

    /// What reading the request's `client_id` gave.
    enum ClientIDRead {
        /// The request's `client_id`, `nil` when it names none (or cannot be read: the route says why).
        case found(String?)
        /// The body is over `server.max_body_bytes`: answered 413 here, as the route would.
        case bodyTooLarge
    }

    /// The `client_id` of the query, or of the form body of a POST to an endpoint apps call directly; the body stays readable.
    static func clientID(of request: inout Request, path: String, limit: Int) async -> ClientIDRead {
        guard request.method == .post else {
            let form = try? FormParameters(parsing: Array((request.uri.query ?? "").utf8), recognizing: ["client_id"])
            return .found(form?["client_id"])
        }
        guard answersOAuthJSON(path), AuthorizationServer.refusingNonFormBody(request) == nil else { return .found(nil) }
        let body: ByteBuffer
        do {
            body = try await request.collectBody(upTo: limit)
        } catch {
            return .bodyTooLarge
        }
        return .found((try? FormParameters(parsing: body.readableBytesView, recognizing: ["client_id"]))?["client_id"])
    }
}

extension Response {
    /// 429 with `Retry-After`: a problem document, or the error page for a browser.
    static func tooManyRequests(retryAfter seconds: Int, for request: Request) -> Response {
        var response = Response.problem(.rateLimited(retryAfter: seconds), for: request)
        response.headers[.retryAfter] = String(seconds)
        return response
    }
}
