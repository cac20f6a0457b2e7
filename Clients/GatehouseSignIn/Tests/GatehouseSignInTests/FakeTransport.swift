import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import GatehouseSignIn
import Synchronization
import Testing

/// One scripted answer of the fake Gatehouse.
struct Reply: Sendable {
    var status: Int
    var body: Data
    var headers: [String: String]
    /// Throw instead of answering (no connection).
    var fails = false
    /// Wait this long before answering.
    var delay: Duration = .zero

    static func json(_ status: Int, _ object: [String: any Sendable], headers: [String: String] = [:]) -> Reply {
        let data = try! JSONSerialization.data(withJSONObject: object)
        return Reply(status: status, body: data, headers: headers.merging(["Content-Type": "application/json"]) { a, _ in a })
    }

    static let noConnection = Reply(status: 0, body: Data(), headers: [:], fails: true)
}

/// A `SignInTransport` that records every request and answers the scripted replies in order.
final class FakeTransport: SignInTransport {
    private let state: Mutex<(requests: [URLRequest], replies: [Reply])>

    init(_ replies: [Reply] = []) {
        state = Mutex((requests: [], replies: replies))
    }

    var requests: [URLRequest] { state.withLock { $0.requests } }

    func script(_ replies: Reply...) {
        state.withLock { $0.replies += replies }
    }

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let reply = state.withLock { state -> Reply? in
            state.requests.append(request)
            return state.replies.isEmpty ? nil : state.replies.removeFirst()
        }
        guard let reply else {
            Issue.record("unscripted request to \(request.url?.absoluteString ?? "?")")
            throw URLError(.cannotConnectToHost)
        }
        if reply.delay > .zero { try await Task.sleep(for: reply.delay) }
        if reply.fails { throw URLError(.notConnectedToInternet) }
        let response = HTTPURLResponse(url: request.url!, statusCode: reply.status, httpVersion: "HTTP/1.1", headerFields: reply.headers)!
        return (reply.body, response)
    }
}

/// Every state an `InAppSignIn` reported through `onStateChange`, with its error.
final class StateRecorder: Sendable {
    private let entries = Mutex<[(SignInState, SignInError?)]>([])

    var states: [SignInState] { entries.withLock { $0.map(\.0) } }
    var names: [String] { states.map(\.name) }
    var errors: [SignInError?] { entries.withLock { $0.map(\.1) } }

    func record(_ state: SignInState, _ error: SignInError?) {
        entries.withLock { $0.append((state, error)) }
    }

    func clear() {
        entries.withLock { $0.removeAll() }
    }
}

enum Fixture {
    static let issuer = URL(string: "https://gatehouse.example")!
    static let challengeEndpoint = "https://gatehouse.example/oauth/authorize-challenge"
    static let tokenEndpoint = "https://gatehouse.example/oauth/token"
    static let authorizationEndpoint = "https://gatehouse.example/oauth/authorize"
    static let clientID = "com.example.app"
    static let redirect = URL(string: "com.example.app:/oauth/callback")!

    static func metadata(challenge: Bool = true) -> Reply {
        var document: [String: any Sendable] = ["issuer": issuer.absoluteString, "token_endpoint": tokenEndpoint,
                                                "authorization_endpoint": authorizationEndpoint]
        if challenge { document["authorization_challenge_endpoint"] = challengeEndpoint }
        return .json(200, document)
    }

    static func step(_ step: String, session: String, failure: String? = nil) -> Reply {
        var body: [String: any Sendable] = ["error": "insufficient_authorization", "auth_session": session, "step": step]
        if let failure { body["failure"] = failure }
        return .json(403, body)
    }

    static func code(_ code: String = "ghc_code") -> Reply { .json(200, ["authorization_code": code]) }

    static func tokens(type: String = "Bearer") -> Reply {
        .json(200, ["access_token": "gha_secret_access", "token_type": type, "expires_in": 3600,
                    "refresh_token": "ghr_secret_refresh", "scope": "read write"])
    }

    /// A client, its transport and its recorder, with `replies` scripted.
    static func client(_ replies: Reply..., scope: String? = "read write", dpop: DPoPKey? = nil, redirectURI: URL? = nil)
        throws -> (InAppSignIn, FakeTransport, StateRecorder) {
        let transport = FakeTransport(replies)
        let recorder = StateRecorder()
        let client = try InAppSignIn(issuer: issuer, clientID: clientID, scope: scope, dpopKey: dpop, redirectURI: redirectURI,
                                     transport: transport, onStateChange: { recorder.record($0, $1) })
        return (client, transport, recorder)
    }

    /// A client in state `signIn` (metadata read, account checked, session "s1"), recorder cleared.
    static func signingInClient(dpop: DPoPKey? = nil, password: String = "correct horse") async throws
        -> (InAppSignIn, FakeTransport, StateRecorder) {
        let (client, transport, recorder) = try client(metadata(), step("password", session: "s1"), dpop: dpop)
        try await client.start()
        try await client.checkAccount("user@example.com")
        try await client.setPassword(password)
        #expect(await client.state == .signIn)
        recorder.clear()
        return (client, transport, recorder)
    }
}

extension URLRequest {
    /// The form fields of the body, decoded.
    var form: [String: String] {
        guard let body = httpBody, let text = String(data: body, encoding: .utf8), !text.isEmpty else { return [:] }
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = String(parts[0]).removingPercentEncoding!
            #expect(fields[name] == nil, "field \(name) sent twice")
            fields[name] = parts.count > 1 ? String(parts[1]).removingPercentEncoding! : ""
        }
        return fields
    }
}

extension URL {
    var queryFields: [String: String] {
        let items = URLComponents(url: self, resolvingAgainstBaseURL: false)?.queryItems ?? []
        return Dictionary(items.map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { a, _ in a })
    }

    var withoutQuery: String {
        var components = URLComponents(url: self, resolvingAgainstBaseURL: false)!
        components.query = nil
        return components.url!.absoluteString
    }
}

/// Base64url decoding written apart from the library's.
func base64URLDecode(_ text: String) -> Data? {
    var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while base64.count % 4 != 0 { base64 += "=" }
    return Data(base64Encoded: base64)
}

func base64URLEncode(_ data: some Sequence<UInt8>) -> String {
    Data(data).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}
