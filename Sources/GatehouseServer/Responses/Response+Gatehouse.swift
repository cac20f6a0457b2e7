import Foundation
import GatehouseCore
import HTTPTypes
import Hummingbird

extension Response {
    /// JSON bytes with `Cache-Control: no-store`.
    static func json(bytes data: Data, status: HTTPResponse.Status = .ok) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "no-store"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// A value as JSON with `Cache-Control: no-store`.
    static func json(_ value: some Encodable, status: HTTPResponse.Status) -> Response {
        json(bytes: JSONCoding.encode(value), status: status)
    }

    /// A JSON body with `Cache-Control: no-store` and `Pragma: no-cache`, as every OAuth answer carries (RFC 6749 §5.1).
    static func oauthJSON(_ data: Data, status: HTTPResponse.Status = .ok) -> Response {
        var response = json(bytes: data, status: status)
        response.headers[HTTPField.Name("Pragma")!] = "no-cache"
        return response
    }

    /// An RFC 6749 §5.2 error body for the token endpoint.
    static func oauthError(_ error: OAuthError) -> Response {
        oauthError(JSONCoding.encode(["error": error.code, "error_description": error.detail]), status: error.status,
                   retryAfter: error.retryAfter, dpopNonce: error.dpopNonce)
    }

    /// An OAuth error answer whose body says more than `error` and its description (the
    /// authorization challenge endpoint's), with the headers every OAuth error carries:
    /// `Retry-After` when there is a wait, the Basic challenge on a 401, the next DPoP nonce.
    static func oauthError(_ body: Data, status: Int, retryAfter: Int?, dpopNonce: String?) -> Response {
        var response = oauthJSON(body, status: .init(code: status))
        if let retryAfter {
            response.headers[.retryAfter] = String(retryAfter)
        }
        if status == 401 {
            response.headers[.wwwAuthenticate] = #"Basic realm="gatehouse""#
        }
        if let dpopNonce {
            response.headers[HTTPField.Name("DPoP-Nonce")!] = dpopNonce
        }
        return response
    }

    /// A 302 to `location` that no cache keeps.
    static func redirect(to location: String) -> Response {
        var headers = HTTPFields()
        headers[.location] = location
        headers[.cacheControl] = "no-store"
        return Response(status: .found, headers: headers)
    }

    /// A 503 problem with `Retry-After`: nothing was decided, the caller may simply try again.
    static func unavailable(_ problem: GatehouseProblem, for request: Request) -> Response {
        var response = Response.problem(problem, for: request)
        response.headers[.retryAfter] = "5"
        return response
    }

    /// An RFC 9457 problem, as `application/problem+json`, or as an HTML page for a browser.
    static func problem(_ problem: GatehouseProblem, for request: Request, allow: [HTTPRequest.Method] = [],
                        signIn: ProblemBody.SignIn? = nil) -> Response {
        var headers = HTTPFields()
        headers[.cacheControl] = "no-store"
        if !allow.isEmpty {
            headers[.allow] = allow.map(\.rawValue).joined(separator: ", ")
        }
        let body: Data
        if request.prefersHTML {
            headers[.contentType] = "text/html; charset=utf-8"
            headers[.contentSecurityPolicy] = "default-src 'none'; style-src 'unsafe-inline'"
            body = Data(ErrorPage.html(for: problem).utf8)
        } else {
            headers[.contentType] = "application/problem+json"
            body = JSONCoding.encode(ProblemBody(problem, instance: request.uri.path, signIn: signIn))
        }
        return Response(status: .init(code: problem.status), headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}

extension Request {
    /// True when the Accept header ranks `text/html` above JSON: a browser, not an API client.
    var prefersHTML: Bool {
        guard let accept = headers[.accept]?.lowercased() else { return false }
        guard let html = accept.range(of: "text/html") else { return false }
        let json = [accept.range(of: "application/json"), accept.range(of: "application/problem+json")].compactMap { $0 }
        return json.allSatisfy { html.lowerBound < $0.lowerBound }
    }
}

/// The RFC 9457 members Gatehouse fills in, plus its own `code`.
struct ProblemBody: Encodable {
    let type: String
    let title: String
    let status: Int
    let detail: String
    let instance: String
    let code: String
    let sign_in: SignIn?

    /// Where the app signs in again, on a 401 from the relay (myVOO step 1b).
    struct SignIn: Encodable {
        let authorization_endpoint: String
        let client_id: String?
        let url: String?
    }

    init(_ problem: GatehouseProblem, instance: String, signIn: SignIn? = nil) {
        self.type = "urn:gatehouse:problem:\(problem.code)"
        self.title = problem.title
        self.status = problem.status
        self.detail = problem.detail
        self.instance = instance
        self.code = problem.code
        self.sign_in = signIn
    }
}
