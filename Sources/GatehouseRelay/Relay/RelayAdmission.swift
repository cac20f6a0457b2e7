public import GatehouseCore

/// What the relay reads of a request head, whichever HTTP types carry it: NIO's
/// `HTTPRequestHead` on the fast path, Hummingbird's request on the general path.
public protocol RelayRequestHead {
    /// The method as sent (`GET`, `POST`…).
    var methodName: String { get }
    /// The request target as sent: path and query, never decoded.
    var rawTarget: String { get }
    /// The values of one header field, in order (empty when absent).
    func values(of field: RelayHeadField) -> [String]
    /// Every field as sent, in order.
    func forEachField(_ body: (_ name: String, _ value: String) -> Void)
}

/// The fields the admission decision reads.
public enum RelayHeadField: Sendable {
    case authorization, contentLength, transferEncoding, expect, connection
}

/// Why a relayed request is refused before its token is looked at, or by the route's rule.
public enum RelayRefusal: Error, Sendable {
    /// Answer this problem (400, 405, 413, 417, 501).
    case problem(GatehouseProblem, allow: [String] = [])
    /// 401 with where to sign in again: no usable bearer token.
    case signIn(detail: String)
}

/// The one admission decision both relay paths make: method, request target, body framing
/// and bearer token, then (once the caller is known) the route's rule. The fast path and the
/// general path differ only in how they carry out what this decides.
public struct RelayAdmission: Sendable {
    /// How the app's body is framed.
    public enum Body: Sendable, Equatable {
        case none
        case length(Int)
        case chunked
    }

    public let route: RouteSettings
    /// What the backend is sent as request target (`RelayTarget`).
    public let target: String
    /// The token of the `Authorization` header (an upstream token or a Gatehouse one), or of the
    /// web-session cookie.
    public let bearer: String
    /// How the token came: `Authorization: Bearer`, `Authorization: DPoP` (RFC 9449), or the
    /// web-session cookie of a route with `accept_session_cookie`.
    public let scheme: Scheme

    public enum Scheme: Sendable, Equatable {
        case bearer, dpop, cookie
    }
    public let body: Body
    /// `Expect: 100-continue`: the app waits for `100 Continue` before sending its body.
    public let expectsContinue: Bool
    /// The lower-cased names listed in `Connection`.
    public let connectionTokens: Set<String>

    /// Admits `head` on `route` (whose backend path, without trailing slash, is `backendPath`)
    /// or says why not, in the order an app can act on: method, target, framing, token.
    ///
    /// `sessionCookie`: the web-session cookie's token, taken only when the request has no
    /// `Authorization` at all (a route with `accept_session_cookie`).
    public static func admit(_ head: some RelayRequestHead, route: RouteSettings, backendPath: String, sessionCookie: String? = nil)
        -> Result<RelayAdmission, RelayRefusal>
    {
        let method = head.methodName
        guard route.methods.contains(method) else {
            return .failure(.problem(.methodNotAllowed(), allow: route.methods.sorted()))
        }
        let target: String
        switch RelayTarget.make(rawTarget: head.rawTarget, prefix: route.prefix, backendPath: backendPath) {
        case .success(let made): target = made.target
        case .failure(let refusal): return .failure(.problem(.badRequest(refusal.description + ".")))
        }
        let body: Body
        switch RequestFraming.isChunked(transferEncoding: head.values(of: .transferEncoding)) {
        case .failure(let problem):
            return .failure(.problem(problem))
        case .success(true):
            body = .chunked
        case .success(false):
            if let length = head.values(of: .contentLength).first {
                guard let bytes = Int(length), bytes >= 0 else { return .failure(.problem(.badRequest("The Content-Length is not a number."))) }
                body = bytes == 0 ? .none : .length(bytes)
                if bytes > route.maximumBodyBytes { return .failure(.problem(.payloadTooLarge(limit: route.maximumBodyBytes))) }
            } else {
                body = .none
            }
        }
        let expectsContinue: Bool
        switch RequestFraming.expectsContinue(expect: head.values(of: .expect)) {
        case .failure(let problem): return .failure(.problem(problem))
        case .success(let expects): expectsContinue = expects && body != .none
        }
        let authorization = head.values(of: .authorization)
        let credential: (token: String, scheme: Scheme)
        if let bearer = bearerToken(authorization) {
            credential = (bearer, .bearer)
        } else if let bound = token(authorization, scheme: "dpop ") {
            credential = (bound, .dpop)
        } else if authorization.isEmpty, let sessionCookie, isHeaderSafeToken(sessionCookie), sessionCookie.utf8.count <= 8192 {
            credential = (sessionCookie, .cookie)
        } else {
            return .failure(.signIn(detail: "The request carries no Bearer access token."))
        }
        let connection = head.values(of: .connection)
        return .success(RelayAdmission(route: route, target: target, bearer: credential.token, scheme: credential.scheme, body: body,
                                       expectsContinue: expectsContinue,
                                       connectionTokens: connection.isEmpty ? [] : RelayHeaderPolicy.connectionTokens(connection)))
    }

    /// The route's rule for the caller: `nil` to pass, a 403 otherwise.
    public func authorize(_ identity: CallerIdentity) -> GatehouseProblem? {
        guard let violation = route.rule.violation(by: identity) else { return nil }
        return .forbidden(violation.prefix(1).uppercased() + violation.dropFirst() + ".")
    }

    /// Whether `token` may follow `Bearer ` in a header as it is: visible ASCII only (no space,
    /// no control character that could end or split the header).
    public static func isHeaderSafeToken(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    /// The token of a single `Authorization: Bearer …` header (RFC 6750 §2.1); `nil` otherwise.
    public static func bearerToken(_ values: [String]) -> String? {
        token(values, scheme: "bearer ")
    }

    /// The token of a single `Authorization` header of `scheme` (lower case, with its space); `nil` otherwise.
    public static func token(_ values: [String], scheme: String) -> String? {
        let length = scheme.utf8.count
        guard values.count == 1, let value = values.first?.utf8, value.count > length else { return nil }
        guard value.prefix(length).elementsEqual(scheme.utf8, by: { $0 | 0x20 == $1 }) else { return nil }
        var token = value.dropFirst(length)
        while token.first == UInt8(ascii: " ") { token = token.dropFirst() }
        while token.last == UInt8(ascii: " ") { token = token.dropLast() }
        guard !token.isEmpty, token.count <= 8192, !token.contains(UInt8(ascii: " ")) else { return nil }
        return String(token)
    }
}
