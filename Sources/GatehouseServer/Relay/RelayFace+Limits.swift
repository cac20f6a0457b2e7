import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import Hummingbird
import HTTPTypes
import Tracing
import Logging
import NIOHTTP1

extension RelayFace {
    /// 429 when the caller's subject is over `relay_per_subject`; `nil` to go on.
    func refusingOverSubjectLimit(_ identity: CallerIdentity, token: String, clientID: String?, request: Request) -> Response? {
        guard let wait = limits.take(.relay_subject, key: RateLimiters.relaySubjectKey(identity, token: token), clientID: clientID,
                                     subject: identity.subject) else { return nil }
        return .tooManyRequests(retryAfter: wait.retryAfterSeconds, for: request)
    }

    /// 429 when the client address is over `identity_lookups_per_address` and the token is not
    /// in the identity cache (a real look-up is about to happen); `nil` to go on. A cached
    /// answer, positive or negative, costs the identity service nothing and is never limited.
    func refusingOverLookupLimit(token: String, upstream: String, request: Request, clientAddress: () -> String?) -> Response? {
        guard limits.identityLookupsPerAddress != nil,
              services.cache.peek(token: token, upstream: upstream, counting: false) == nil,
              let address = clientAddress(),
              let wait = limits.take(.identity_address, key: address) else { return nil }
        return .tooManyRequests(retryAfter: wait.retryAfterSeconds, for: request)
    }

    /// 429 when the client address is over `identity_lookups_per_address` and the Gatehouse access
    /// token is not among the sessions recently opened: finding it costs a store query, which a
    /// flood of made-up tokens must not be able to ask for without limit; `nil` to go on.
    func refusingOverSessionLookupLimit(token: String, request: Request, clientAddress: () -> String?) -> Response? {
        guard limits.identityLookupsPerAddress != nil, let sessions = sealedSessions?.services, !sessions.hasOpenView(forGatehouseToken: token),
              let address = clientAddress(),
              let wait = limits.take(.identity_address, key: address) else { return nil }
        return .tooManyRequests(retryAfter: wait.retryAfterSeconds, for: request)
    }

}

/// Writes the W3C trace context (`traceparent`, `tracestate`) into the headers of a request
/// toward a backend.
struct BackendHeadersInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout HTTPHeaders) {
        carrier.replaceOrAdd(name: key, value: value)
    }
}

extension Response {
    /// A 503 problem with `Retry-After`: the wait an upstream asked for (its 429), else 5 s.
    static func unavailable(_ problem: GatehouseProblem, for request: Request, retryAfter: Int?) -> Response {
        var response = Response.unavailable(problem, for: request)
        if let retryAfter { response.headers[.retryAfter] = String(retryAfter) }
        return response
    }
}
