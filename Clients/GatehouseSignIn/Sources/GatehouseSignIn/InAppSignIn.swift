public import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The in-app sign-in of a first-party app at Gatehouse's authorization challenge endpoint
/// (draft-ietf-oauth-first-party-apps, docs/in-app-sign-in.md), run as the state machine of
/// Mozilla VPN's in-app authentication.
///
/// Each method is valid in one state only (the seed's); called in another, or while a request is
/// under way, it throws `SignInError.invalidState` and sends nothing. Every other outcome (a
/// wrong password, a rate limit, no network) is the server's answer: the method returns the new
/// `state`, and `lastError` says what went wrong. `stateUpdates` and `onStateChange` see every
/// state, the transient ones (`checkingAccount`, `signingIn`, `verifying…`) included.
public actor InAppSignIn {
    public private(set) var state: SignInState = .initializing
    /// The error of the last call (nil when it went well); set before the state it led to is reported.
    public private(set) var lastError: SignInError?
    /// When the state is `fallbackInBrowser`: the URL, verifier and `state` the browser sign-in needs.
    public private(set) var browserSignIn: BrowserSignIn?
    /// Every state the client enters, in order (one consumer).
    public nonisolated let stateUpdates: AsyncStream<SignInState>

    public nonisolated let issuer: URL
    public nonisolated let clientID: String
    public nonisolated let scope: String?
    public nonisolated let redirectURI: URL?
    public nonisolated let dpopKey: DPoPKey?

    private let transport: any SignInTransport
    private let onStateChange: (@Sendable (SignInState, SignInError?) -> Void)?
    private let continuation: AsyncStream<SignInState>.Continuation

    private var endpoints: Endpoints?
    /// The dialogue: the last `auth_session` Gatehouse answered (single use), the PKCE verifier of
    /// its first request, its `state` parameter, and the password while a step may need it again.
    private var authSession: String?
    private var pkce: PKCE?
    private var oauthState: String?
    private var password: String?
    private var dpopNonce: String?
    private var busy = false

    /// - Parameters:
    ///   - issuer: Gatehouse's issuer URL (`https://gatehouse.example`); plain http only for a loopback host.
    ///   - redirectURI: sent with the first request, used only if the dialogue falls back to the browser.
    ///   - onStateChange: called with every state entered and the error that came with it.
    /// - Throws: `SignInError.unexpected` when the issuer is neither https nor a loopback http URL.
    public init(issuer: URL, clientID: String, scope: String? = nil, dpopKey: DPoPKey? = nil, redirectURI: URL? = nil,
                transport: any SignInTransport = URLSessionTransport(),
                onStateChange: (@Sendable (SignInState, SignInError?) -> Void)? = nil) throws(SignInError) {
        guard EndpointSecurity.isAcceptable(issuer) else {
            throw .unexpected("the issuer must be an https URL (plain http only on a loopback host)")
        }
        self.issuer = issuer
        self.clientID = clientID
        self.scope = scope.flatMap { $0.isEmpty ? nil : $0 }
        self.dpopKey = dpopKey
        self.redirectURI = redirectURI
        self.transport = transport
        self.onStateChange = onStateChange
        (stateUpdates, continuation) = AsyncStream.makeStream(of: SignInState.self)
    }

    deinit {
        continuation.finish()
    }

    /// A plausible e-mail address (the seed's `validateEmailAddress`): one `@` with text on both
    /// sides, a dot in the domain, no spaces. `checkAccount` itself takes any non-empty login,
    /// since some upstreams sign in by username.
    public nonisolated static func validateEmailAddress(_ address: String) -> Bool {
        let parts = address.split(separator: "@", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, !address.contains(where: \.isWhitespace) else { return false }
        let labels = parts[1].split(separator: ".", omittingEmptySubsequences: false)
        return labels.count >= 2 && labels.allSatisfy { !$0.isEmpty }
    }

    // MARK: - The seed's methods

    /// `initializing` → `start`: reads `{issuer}/.well-known/oauth-authorization-server`. Without an
    /// `authorization_challenge_endpoint`, → `fallbackInBrowser` with an ordinary authorization URL.
    @discardableResult
    public func start() async throws(SignInError) -> SignInState {
        try begin(in: .initializing)
        defer { busy = false }
        let url = URL(string: issuer.absoluteString.trimmingSuffix("/") + "/.well-known/oauth-authorization-server")!
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let data: Data
        let response: HTTPURLResponse
        do {
            (data, response) = try await transport.send(request)
        } catch {
            return settle(.initializing, .network)
        }
        guard response.statusCode == 200, let document = JSONValue.object(from: data) else {
            return settle(.initializing, .unexpected("the metadata answered HTTP \(response.statusCode)"))
        }
        switch Endpoints.parse(document) {
        case .failure(let error):
            return settle(.initializing, error)
        case .success(let endpoints):
            self.endpoints = endpoints
            if endpoints.challenge == nil {
                return fallbackInBrowser(requestURI: nil, from: .initializing)
            }
            return settle(.start, nil)
        }
    }

    /// `start` → `checkingAccount` → `signIn`, `emailVerification`, `fallbackInBrowser`…: the
    /// first request of a new dialogue, with `login` as `login_hint` and a fresh PKCE verifier.
    @discardableResult
    public func checkAccount(_ login: String) async throws(SignInError) -> SignInState {
        try begin(in: .start)
        defer { busy = false }
        let login = login.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !login.isEmpty else { return settle(.start, .invalidEmailAddress) }
        endDialogue()
        browserSignIn = nil
        let pkce = PKCE()
        self.pkce = pkce
        var fields = [("client_id", clientID), ("response_type", "code"), ("code_challenge", pkce.challenge),
                      ("code_challenge_method", PKCE.method), ("login_hint", login)]
        if let scope { fields.append(("scope", scope)) }
        if let redirectURI {
            let oauthState = Base64URL.encode(randomBytes(16))
            self.oauthState = oauthState
            fields += [("redirect_uri", redirectURI.absoluteString), ("state", oauthState)]
        }
        enter(.checkingAccount)
        return await challenge(fields, waiting: .start)
    }

    /// Keeps the password for `signIn()` (and for `verifyUnblockCode(_:)`, which sends it again).
    /// Valid in `signIn`, and in `unblockCodeNeeded` when the password is to be typed with the code.
    public func setPassword(_ password: String) throws(SignInError) {
        guard !busy, state == .signIn || state == .unblockCodeNeeded else { throw .invalidState }
        self.password = password.isEmpty ? nil : password
    }

    /// `signIn` → `signingIn` → `signIn` (with an error), `unblockCodeNeeded`, `totpVerificationNeeded`,
    /// `finalize`: sends the password set by `setPassword(_:)` (`invalidState` when there is none).
    @discardableResult
    public func signIn() async throws(SignInError) -> SignInState {
        guard let password else { throw .invalidState }
        try begin(in: .signIn)
        defer { busy = false }
        enter(.signingIn)
        return await challenge([("password", password)], waiting: .signIn)
    }

    /// `unblockCodeNeeded` → `verifyingUnblockCode` → `unblockCodeNeeded` (with an error),
    /// `totpVerificationNeeded`, `finalize`: sends the e-mailed code with the password again.
    @discardableResult
    public func verifyUnblockCode(_ code: String) async throws(SignInError) -> SignInState {
        guard let password else { throw .invalidState }
        try begin(in: .unblockCodeNeeded)
        defer { busy = false }
        enter(.verifyingUnblockCode)
        return await challenge([("unblock_code", Self.digits(code)), ("password", password)], waiting: .unblockCodeNeeded)
    }

    /// `unblockCodeNeeded` → `unblockCodeNeeded`: asks for a new unblock code e-mail.
    @discardableResult
    public func resendUnblockCodeEmail() async throws(SignInError) -> SignInState {
        try begin(in: .unblockCodeNeeded)
        defer { busy = false }
        return await challenge([("resend", "unblock_code")], waiting: .unblockCodeNeeded)
    }

    /// `totpVerificationNeeded` → `verifyingSessionTotpCode` → `totpVerificationNeeded` (with an error), `finalize`.
    @discardableResult
    public func verifySessionTotpCode(_ code: String) async throws(SignInError) -> SignInState {
        try begin(in: .totpVerificationNeeded)
        defer { busy = false }
        enter(.verifyingSessionTotpCode)
        return await challenge([("otp", Self.digits(code))], waiting: .totpVerificationNeeded)
    }

    /// `emailVerification` → `verifyingSessionEmailCode` → `emailVerification` (with an error), `finalize`:
    /// sends the code the e-mailed link handed to the app.
    @discardableResult
    public func verifySessionEmailCode(_ code: String) async throws(SignInError) -> SignInState {
        try begin(in: .emailVerification)
        defer { busy = false }
        enter(.verifyingSessionEmailCode)
        return await challenge([("email_code", code.trimmingCharacters(in: .whitespacesAndNewlines))],
                               waiting: .emailVerification)
    }

    /// `emailVerification` → `emailVerification`: asks for the link to be e-mailed again.
    @discardableResult
    public func resendVerificationSessionCodeEmail() async throws(SignInError) -> SignInState {
        try begin(in: .emailVerification)
        defer { busy = false }
        return await challenge([("resend", "email_link")], waiting: .emailVerification)
    }

    /// Abandons the dialogue and goes back to `start` (the user wants to type another address,
    /// or to try again after `finalize` or `fallbackInBrowser`). Not while a request is under way,
    /// nor before `start()` has found a challenge endpoint. Nothing is sent.
    @discardableResult
    public func reset() throws(SignInError) -> SignInState {
        guard !busy, !state.isTransient, state != .initializing, endpoints?.challenge != nil else { throw .invalidState }
        endDialogue()
        browserSignIn = nil
        return settle(.start, nil)
    }

    // MARK: - The dialogue

    private func begin(in expected: SignInState) throws(SignInError) {
        guard !busy, state == expected else { throw .invalidState }
        busy = true
        lastError = nil
    }

    /// One request to the challenge endpoint, carrying the held `auth_session`, and the state its
    /// answer leads to (`waiting` is the state of the step being answered).
    private func challenge(_ fields: [(String, String)], waiting: SignInState) async -> SignInState {
        guard let endpoint = endpoints?.challenge else { return settle(waiting, .invalidState) }
        let answer: Answer
        do {
            answer = try await post(to: endpoint, fields, dialogue: true)
        } catch {
            return settle(waiting, .network)
        }
        if answer.endsDialogue {
            // Over (too many wrong inputs, an answer that cannot be used, another key): back to
            // `start`, where a new `checkAccount` begins another.
            return restart(answer.string("failure").map { SignInError(failure: $0, retryAfter: answer.retryAfter, reason: answer.string("reason")) }
                ?? .invalidSession)
        }
        switch (answer.status, answer.error) {
        case (200, _):
            guard let code = answer.string("authorization_code"), !code.isEmpty else {
                return settle(waiting, .unexpected("the answer carries no authorization_code"))
            }
            return await redeem(code)
        case (403, "insufficient_authorization"):
            guard let step = answer.string("step"), let next = SignInState.waiting(forStep: step) else {
                return settle(waiting, .unexpected("an unknown step"))
            }
            let failure = answer.string("failure").map { SignInError(failure: $0, retryAfter: answer.retryAfter) }
            // A refused password is not sent again: the user types it anew (`setPassword`).
            if failure == .incorrectPassword { password = nil }
            return settle(next, failure)
        case (403, "redirect_to_web"):
            return fallbackInBrowser(requestURI: answer.string("request_uri"), from: waiting)
        case (400, "invalid_session"):
            return restart(.invalidSession)
        case (429, _):
            return settle(waiting, .tooManyRequests(retryAfter: answer.retryAfter))
        case (502...504, _):
            let error = answer.string("failure").map { SignInError(failure: $0, retryAfter: answer.retryAfter) }
                ?? (answer.status == 504 ? .requestTimeout : .serverUnavailable)
            return settle(waiting, error)
        default:
            if let failure = answer.string("failure") {
                let error = SignInError(failure: failure, retryAfter: answer.retryAfter)
                return error == .invalidEmailAddress || error == .invalidSession ? restart(error) : settle(waiting, error)
            }
            return settle(waiting, .unexpected(answer.error ?? "HTTP \(answer.status)"))
        }
    }

    /// The authorization code for tokens at the token endpoint: PKCE verifier, no `redirect_uri`
    /// (the dialogue sent none to the authorization), a DPoP proof when there is a key.
    private func redeem(_ code: String) async -> SignInState {
        guard let tokenEndpoint = endpoints?.token, let verifier = pkce?.verifier else { return restart(.authenticationFailure) }
        let fields = [("grant_type", "authorization_code"), ("code", code), ("client_id", clientID), ("code_verifier", verifier)]
        guard let answer = try? await post(to: tokenEndpoint, fields, dialogue: false), answer.status == 200,
              let tokens = answer.body.flatMap(Tokens.init(raw:))
        else { return restart(.authenticationFailure) }
        endDialogue()
        return settle(.finalize(tokens), nil)
    }

    /// The browser fallback: the pushed request (`request_uri`, RFC 9126 §4) when Gatehouse kept
    /// one, otherwise a fresh authorization request with PKCE.
    private func fallbackInBrowser(requestURI: String?, from waiting: SignInState) -> SignInState {
        guard let authorizationEndpoint = endpoints?.authorization else {
            return settle(waiting, .unexpected("the metadata has no authorization_endpoint"))
        }
        let fallback: BrowserSignIn?
        if let requestURI, !requestURI.isEmpty, let pkce {
            fallback = FormEncoding.url(authorizationEndpoint, adding: [("client_id", clientID), ("request_uri", requestURI)])
                .map { BrowserSignIn(url: $0, codeVerifier: pkce.verifier, state: oauthState, redirectURI: redirectURI,
                                     tokenEndpoint: endpoints?.token) }
        } else {
            let pkce = PKCE()
            let oauthState = Base64URL.encode(randomBytes(16))
            var fields = [("response_type", "code"), ("client_id", clientID)]
            if let redirectURI { fields.append(("redirect_uri", redirectURI.absoluteString)) }
            if let scope { fields.append(("scope", scope)) }
            fields += [("state", oauthState), ("code_challenge", pkce.challenge), ("code_challenge_method", PKCE.method)]
            fallback = FormEncoding.url(authorizationEndpoint, adding: fields)
                .map { BrowserSignIn(url: $0, codeVerifier: pkce.verifier, state: oauthState, redirectURI: redirectURI,
                                     tokenEndpoint: endpoints?.token) }
        }
        guard let fallback else { return settle(waiting, .unexpected("the authorization URL cannot be built")) }
        endDialogue()
        browserSignIn = fallback
        return settle(.fallbackInBrowser(fallback.url), nil)
    }

    /// Back to `start` with `error`: the dialogue is over (a new `checkAccount` starts another).
    private func restart(_ error: SignInError) -> SignInState {
        endDialogue()
        return settle(.start, error)
    }

    private func endDialogue() {
        authSession = nil
        password = nil
        pkce = nil
        oauthState = nil
    }

    /// Enters a transient state (reported; no error).
    private func enter(_ next: SignInState) {
        state = next
        report()
    }

    private func settle(_ next: SignInState, _ error: SignInError?) -> SignInState {
        lastError = error
        state = next
        report()
        return next
    }

    private func report() {
        continuation.yield(state)
        onStateChange?(state, lastError)
    }

    // MARK: - HTTP

    /// A form POST with a DPoP proof when there is a key. A `use_dpop_nonce` answer with a
    /// `DPoP-Nonce` is retried once with that nonce; any `DPoP-Nonce` is kept for later proofs.
    /// With `dialogue`, the request carries the held `auth_session`, and any answer's replaces it.
    private func post(to url: URL, _ fields: [(String, String)], dialogue: Bool) async throws -> Answer {
        var retried = false
        while true {
            var request = URLRequest(url: url, timeoutInterval: 30)
            request.httpMethod = "POST"
            request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
            request.setValue("application/json", forHTTPHeaderField: "Accept")
            let sent = dialogue && authSession != nil ? [("auth_session", authSession!)] + fields : fields
            request.httpBody = Data(FormEncoding.encode(sent).utf8)
            if let dpopKey {
                request.setValue(try dpopKey.proof(method: "POST", url: url, nonce: dpopNonce), forHTTPHeaderField: "DPoP")
            }
            let (data, response) = try await transport.send(request)
            let nonce = response.value(forHTTPHeaderField: "DPoP-Nonce").flatMap { $0.isEmpty ? nil : $0 }
            if let nonce { dpopNonce = nonce }
            let answer = Answer(status: response.statusCode, body: JSONValue.object(from: data),
                                retryAfterHeader: response.value(forHTTPHeaderField: "Retry-After"))
            if dialogue, let next = answer.string("auth_session"), !next.isEmpty { authSession = next }
            if answer.status == 400 || answer.status == 401, answer.error == "use_dpop_nonce", dpopKey != nil, nonce != nil, !retried {
                retried = true
                continue
            }
            return answer
        }
    }

    private static func digits(_ code: String) -> String {
        code.filter { !$0.isWhitespace && $0 != "-" }
    }
}

/// One answer of Gatehouse: its status and JSON body.
private struct Answer {
    let status: Int
    let body: [String: JSONValue]?
    let retryAfterHeader: String?

    var error: String? { string("error") }

    func string(_ name: String) -> String? { body?[name]?.stringValue }

    /// The server ended the dialogue: the held `auth_session` is spent.
    var endsDialogue: Bool { body?["dialogue_ended"] == .bool(true) }

    /// `retry_after` of the body, else the `Retry-After` header's seconds.
    var retryAfter: Int? {
        body?["retry_after"]?.intValue ?? retryAfterHeader.flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
    }
}

/// The endpoints of the metadata (RFC 8414) the dialogue uses.
private struct Endpoints {
    let challenge: URL?
    let token: URL?
    let authorization: URL?

    /// The endpoints, each https (or http on a loopback host); a challenge endpoint needs a token
    /// endpoint, and no challenge endpoint needs an authorization endpoint.
    static func parse(_ metadata: [String: JSONValue]) -> Result<Endpoints, SignInError> {
        var urls: [String: URL] = [:]
        for name in ["authorization_challenge_endpoint", "token_endpoint", "authorization_endpoint"] {
            guard let text = metadata[name]?.stringValue, !text.isEmpty else { continue }
            guard let url = URL(string: text), EndpointSecurity.isAcceptable(url) else {
                return .failure(.unexpected("the metadata's \(name) is not an https URL"))
            }
            urls[name] = url
        }
        let endpoints = Endpoints(challenge: urls["authorization_challenge_endpoint"], token: urls["token_endpoint"],
                                  authorization: urls["authorization_endpoint"])
        if endpoints.challenge != nil, endpoints.token == nil {
            return .failure(.unexpected("the metadata has no token_endpoint"))
        }
        if endpoints.challenge == nil, endpoints.authorization == nil {
            return .failure(.unexpected("the metadata has neither authorization_challenge_endpoint nor authorization_endpoint"))
        }
        return .success(endpoints)
    }
}

private extension String {
    func trimmingSuffix(_ suffix: String) -> String {
        var text = self
        while text.hasSuffix(suffix) { text.removeLast(suffix.count) }
        return text
    }
}
