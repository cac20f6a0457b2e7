import Foundation
import GatehouseCore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

extension InAppSignIn {
    /// `POST /oauth/authorize-challenge`. `peer`: the connection's address, for the limits per client address.
    func challenge(_ request: Request, peer: String?) async -> Response {
        // A web page can make its visitors' browsers post here (a cross-site form needs no CORS):
        // nothing a browser sent is read, before any e-mail could go to a chosen address.
        if let header = Self.browserHeader(in: request.headers) {
            logger.notice("authorization challenge refused: sent by a browser", metadata: ["header": .string(header)])
            return ChallengeAnswer.refused(.invalidRequest(
                "this endpoint is for native apps: a request a browser sent (with \(header)) is refused")).response
        }
        if let refusal = Self.refusingNonFormBody(request) { return refusal }
        let address = limits.clientAddress(peer: peer, headers: request.headers)
        let resolved = limits.resolvedClientAddress(peer: peer, headers: request.headers)
        // Before anything is read: this answer leaves the app's auth_session as it was.
        if let address, let wait = limits.take(.in_app_address, key: address) {
            return ChallengeAnswer.failed(.tooManyRequests, session: nil, retryAfter: wait.retryAfterSeconds).response
        }
        // Over `server.max_body_bytes`: 413, as at /oauth/token.
        guard let body = await boundedBody(request) else {
            return .problem(.payloadTooLarge(limit: configuration.server.maximumBodyBytes), for: request)
        }
        let answer: ChallengeAnswer
        do throws(OAuthError) {
            let form = try Self.oauthForm(body, recognizing: Self.parameterNames)
            let proof = try await dpop.endpointProof(request, endpoint: Self.path)
            if let session = form["auth_session"] {
                answer = await proceed(ChallengeInput(form: form, proof: proof, address: address, resolvedAddress: resolved), session: session)
            } else {
                answer = try await begin(ChallengeInput(form: form, proof: proof, address: address, resolvedAddress: resolved))
            }
        } catch {
            answer = .refused(error)
        }
        logger.info("authorization challenge answered", metadata: [
            "status": .stringConvertible(answer.status),
            "error": .string(answer.string("error") ?? "none"), "failure": .string(answer.string("failure") ?? "none"),
        ])
        return answer.response
    }

    /// The first header only a browser sends that the request carries: `Origin` (every
    /// cross-origin request and every POST of a current browser, `null` included) or a Fetch
    /// Metadata header (`Sec-Fetch-Site`, `-Mode`, `-Dest`, `-User`: forbidden to scripts, sent by
    /// every current browser). A native app's HTTP client sends none of them.
    static func browserHeader(in headers: HTTPFields) -> String? {
        let names: [HTTPField.Name] = [.origin, Self.secFetchSite, Self.secFetchMode, Self.secFetchDest, Self.secFetchUser]
        return names.first { headers[$0] != nil }?.rawName
    }

    static let secFetchSite = HTTPField.Name("Sec-Fetch-Site")!
    static let secFetchMode = HTTPField.Name("Sec-Fetch-Mode")!
    static let secFetchDest = HTTPField.Name("Sec-Fetch-Dest")!
    static let secFetchUser = HTTPField.Name("Sec-Fetch-User")!

    /// What one request brings.
    struct ChallengeInput {
        let form: FormParameters
        let proof: VerifiedDPoPProof?
        /// The client's address as the limits count it (an IPv6 address by its /64).
        let address: String?
        /// The client's address itself, for an upstream that protects accounts by address.
        let resolvedAddress: String?
    }

    // MARK: The first request

    private func begin(_ input: ChallengeInput) async throws(OAuthError) -> ChallengeAnswer {
        let form = input.form
        guard let clientID = form["client_id"] else { throw .invalidRequest("client_id is required") }
        guard let client = configuration.appClient(for: clientID), let upstream = upstreams[client.upstream] else {
            throw .invalidClient("no app is registered with this client_id")
        }
        // An instance signs in only while live and with its own key; an app that gives tokens only
        // to certified instances is refused here as at /oauth/token (its own client id included).
        var instance: InstanceRecord?
        if client.isInstance {
            guard let instances else { throw .invalidClient("client_id names no registered app instance") }
            instance = try await instances.liveInstance(client.clientID, proof: input.proof).0
        }
        try AppInstances.requireCertification(of: client, instance: instance)
        guard client.inAppSignIn == .on else {
            throw .unauthorizedClient("this app does not sign in in the app (in_app_sign_in is off): use /oauth/authorize")
        }
        // The authorization request's own checks, as at /oauth/authorize (no redirect_uri or state here).
        try AuthorizationRequest.checkResponseType(form)
        let grant = try AuthorizationRequest.checkGrant(form, client: client)

        guard let steps = upstream.inAppSignIn else {
            return try await redirectToWeb(form, client: client)
        }
        // The account as the user typed it, spaces around it dropped; one with spaces inside is
        // refused. It is relayed as typed; its counters key it by its folded form (`accountKey`),
        // so that no spelling the upstream would take for the same account escapes them.
        let login = (form["login_hint"] ?? "").trimmingCharacters(in: .whitespaces)
        guard !login.isEmpty, login.utf8.count <= 254, !login.contains(where: \.isWhitespace) else {
            throw .invalidRequest("login_hint is required: the account's e-mail address or username (at most 254 bytes, no spaces)")
        }
        var dialogue = ChallengeDialogue(clientID: client.clientID, upstream: client.upstream, scopes: grant.scopes,
                                         codeChallenge: grant.codeChallenge, appNonce: grant.nonce, login: login, step: .password,
                                         dpopJKT: input.proof?.thumbprint)
        switch steps.firstStep {
        case .password:
            // Nothing is checked against the upstream yet: a known and an unknown account answer alike.
            return try await save(dialogue) { .next(.password, session: $0) }
        case .emailLink:
            guard EmailAddress.isValid(login) else { return .failed(.invalidEmailAddress, session: nil) }
            if let wait = takeAccount(dialogue) { return .failed(.tooManyRequests, session: nil, retryAfter: wait) }
            guard try await admitEmail(dialogue) else { return .failed(.tooManyRequests, session: nil, retryAfter: Self.mailPause) }
            dialogue.step = .emailLink
            dialogue.emails = 1
            if let refusal = await steps.sendEmailLink(to: login, clientAddress: input.address) {
                let (failure, retryAfter) = Self.failure(of: refusal)
                return .failed(failure, session: nil, retryAfter: retryAfter)
            }
            return try await save(dialogue) { .next(.emailLink, session: $0) }
        }
    }

    /// `redirect_to_web`, with a `request_uri` for `/oauth/authorize` when the app's request is a
    /// whole authorization request (its `redirect_uri` and `state` with the PKCE challenge):
    /// without PKCE there is none (the draft forbids it), nor without a place to come back to.
    private func redirectToWeb(_ form: FormParameters, client: AppClient) async throws(OAuthError) -> ChallengeAnswer {
        let lifetime = configuration.server.transactionLifetime
        guard form["redirect_uri"] != nil, form["state"] != nil,
              case .proceed = AuthorizationRequest.decide(form, clients: [client.clientID: client]) else {
            return .redirectToWeb(requestURI: nil, expiresIn: 0)
        }
        let parameters = AuthorizationRequest.parameterNames.sorted().compactMap { name in form[name].map { (name, $0) } }
        do {
            let requestURI = try await pushAuthorizationRequest(parameters, lifetime: lifetime)
            return .redirectToWeb(requestURI: requestURI, expiresIn: Int(lifetime.inSeconds))
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
    }

    // MARK: Later requests

    private func proceed(_ input: ChallengeInput, session: String) async -> ChallengeAnswer {
        let sealed: Data?
        do {
            sealed = try await store.consumeTransaction(stateHash: ChallengeDialogue.storeKey(authSession: session), now: now())
        } catch {
            return .refused(.serverError("Gatehouse cannot reach its store right now"))
        }
        guard let sealed, var dialogue = try? ChallengeDialogue.unsealed(sealed, with: session) else {
            logger.info("authorization challenge with an unknown, used or expired auth_session")
            return .invalidSession
        }
        if let clientID = input.form["client_id"], clientID != dialogue.clientID {
            logger.warning("security event: an auth_session shown with another client_id")
            return .invalidSession
        }
        // Bound to the first request's key: a stolen auth_session is worth nothing elsewhere, and is spent.
        if let bound = dialogue.dpopJKT, input.proof?.thumbprint != bound {
            logger.warning("security event: an auth_session shown without its DPoP key", metadata: ["client_id": .string(dialogue.clientID)])
            return .refused(.invalidDPoPProof("this auth_session is bound to the DPoP key of its first request"), ended: true)
        }
        guard let client = configuration.appClient(for: dialogue.clientID), client.inAppSignIn == .on,
              let steps = upstreams[dialogue.upstream]?.inAppSignIn else {
            return .invalidSession
        }
        do throws(OAuthError) {
            return try await step(&dialogue, input: input, client: client, steps: steps)
        } catch {
            return .refused(error)
        }
    }

    /// The current step with this request's input.
    private func step(_ dialogue: inout ChallengeDialogue, input: ChallengeInput, client: AppClient, steps: any InAppSignInSteps)
        async throws(OAuthError) -> ChallengeAnswer
    {
        let form = input.form
        let present = ChallengeStep.inputFields.filter { form[$0] != nil }
        let resend = form["resend"]
        // One step at a time: another step's input (an otp before the password) is refused and counted.
        let expected: Set<String> = switch dialogue.step {
        case .unblockCode: resend == nil ? ["unblock_code", "password"] : []
        case .emailLink: resend == nil ? ["email_code"] : []
        case .password, .otp: [dialogue.step.field]
        }
        let resendable = (dialogue.step == .unblockCode || dialogue.step == .emailLink) && resend == dialogue.step.rawValue
        guard present == expected, resend == nil || resendable else {
            dialogue.attempts += 1
            let waiting = dialogue.step
            let detail = "this sign-in waits for \(expected.isEmpty ? "nothing but resend" : expected.sorted().joined(separator: " and "))"
                + (resend == nil || resendable ? "" : "; resend must be \(waiting.rawValue) at this step")
            guard dialogue.attempts < settings.attempts else { return .failed(.tooManyRequests, session: nil, retryAfter: Self.pause, ended: true) }
            return try await save(dialogue) { .refused(.invalidRequest(detail), session: $0) }
        }
        if let wait = takeAccount(dialogue) {
            return try await save(dialogue) { .failed(.tooManyRequests, session: $0, retryAfter: wait) }
        }
        switch dialogue.step {
        case .password:
            return try await password(form["password"] ?? "", dialogue: &dialogue, client: client, steps: steps, input: input)
        case .unblockCode:
            if resend != nil { return try await sendUnblockCode(&dialogue) }
            return try await unblock(code: form["unblock_code"] ?? "", password: form["password"] ?? "", dialogue: &dialogue, steps: steps,
                                     address: input.resolvedAddress)
        case .otp:
            let otp = form["otp"] ?? ""
            guard otp.utf8.count == 6, otp.allSatisfy(\.isASCII), otp.allSatisfy(\.isNumber) else {
                return try await wrong(&dialogue, .invalidTOTPCode)
            }
            guard let token = dialogue.secondFactor else { return .invalidSession }
            // Codes are counted per account in the store before one is sent: however many
            // dialogues run at once, an account gets `attempts` codes per window.
            guard try await count(Self.codePurpose, dialogue) <= settings.attempts else {
                logger.notice("in-app sign-in refused: too many second-factor codes for the account", metadata: ["client_id": .string(dialogue.clientID)])
                return .failed(.tooManyRequests, session: nil, retryAfter: Self.pause, ended: true)
            }
            let result = await steps.secondFactor(token: token, otp: otp, clientAddress: input.resolvedAddress)
            if Self.unjudged(result) {
                try? await store.discountAttempt(purpose: Self.codePurpose, keyHash: accountKey(dialogue), now: now())
            }
            return try await outcome(result, dialogue: &dialogue, wrong: .invalidTOTPCode)
        case .emailLink:
            if resend != nil {
                guard dialogue.emails <= settings.resends else {
                    return try await save(dialogue) { .failed(.tooManyRequests, session: $0, retryAfter: Self.pause) }
                }
                guard try await admitEmail(dialogue) else {
                    return try await save(dialogue) { .failed(.tooManyRequests, session: $0, retryAfter: Self.mailPause) }
                }
                dialogue.emails += 1
                if let refusal = await steps.sendEmailLink(to: dialogue.login, clientAddress: input.address) {
                    let (failure, retryAfter) = Self.failure(of: refusal)
                    return try await save(dialogue) { .failed(failure, session: $0, retryAfter: retryAfter) }
                }
                return try await save(dialogue) { .next(.emailLink, session: $0) }
            }
            let code = form["email_code"] ?? ""
            guard !code.isEmpty, code.utf8.count <= 512 else { return try await wrong(&dialogue, .invalidEmailCode) }
            return try await outcome(await steps.emailCode(code, for: dialogue.login), dialogue: &dialogue, wrong: .invalidEmailCode)
        }
    }

    // MARK: Passwords and unblock codes

    /// A password: relayed to the upstream, unless the account has failed too often lately, the
    /// client is an uncertified install or the wrong-password breaker is tripped, in which case an
    /// unblock code is e-mailed first. The attempt is counted in the store before anything is
    /// relayed, so that dialogues racing on one account, on any instance, relay at most
    /// `unblock_after` passwords per window between two successes; and so is the account among
    /// those the client's address range and app instance tried (`admitAccount`). A store that
    /// cannot count relays nothing.
    private func password(_ password: String, dialogue: inout ChallengeDialogue, client: AppClient, steps: any InAppSignInSteps,
                          input: ChallengeInput) async throws(OAuthError) -> ChallengeAnswer
    {
        guard !password.isEmpty, password.utf8.count <= 1024 else { return try await wrong(&dialogue, .incorrectPassword) }
        // Why the password waits for the e-mailed code, if it does.
        var held: String?
        if try await count(Self.failurePurpose, dialogue) > settings.unblockAfter {
            held = "account"
        } else if try await uncertified(client) {
            held = "uncertified"
        } else if try await breakerTripped(dialogue) {
            held = "breaker"
        }
        var tried: (all: [AccountScope], counted: [AccountScope]) = ([], [])
        if held == nil {
            switch try await admitAccount(dialogue, client: client, address: input.address) {
            case .admitted(let all, let counted): tried = (all, counted)
            case .refused(let scope): held = scope.limit.rawValue
            }
        }
        if let held {
            guard EmailAddress.isValid(dialogue.login) else {
                // No address to send a code to: the browser sign-in, with the upstream's own defences.
                return try await redirectToWeb(FormParameters(), client: client)
            }
            logger.notice("in-app sign-in asks for an unblock code", metadata: ["client_id": .string(dialogue.clientID), "because": .string(held)])
            return try await sendUnblockCode(&dialogue)
        }
        return try await relay(password, dialogue: &dialogue, steps: steps, address: input.resolvedAddress, counted: true, tried: tried)
    }

    /// Relays the password; `counted`: the attempt is in the account's count already (no second
    /// factor passed yet); `tried`: the scopes that count the account among those they tried,
    /// and those that counted it for this request.
    private func relay(_ password: String, dialogue: inout ChallengeDialogue, steps: any InAppSignInSteps, address: String?, counted: Bool,
                       tried: (all: [AccountScope], counted: [AccountScope]) = ([], [])) async throws(OAuthError) -> ChallengeAnswer
    {
        var result = await steps.password(login: dialogue.login, password: password, scopes: dialogue.scopes, clientAddress: address)
        // The upstream refused the account, perhaps after its right password. Until a second factor
        // is passed this is a wrong password from here on (the same answer, counted as one): the
        // user meets the unblock code after `unblock_after` tries, and is told after it (`outcome`).
        var failureReason = InAppFailure.incorrectPassword.rawValue
        if counted, case .refused(.accountRefused(let reason)) = result {
            logger.notice("in-app sign-in: the upstream refused the account; answered as a wrong password until a second factor",
                          metadata: ["upstream": .string(dialogue.upstream), "reason": .string(reason.rawValue)])
            failureReason = "account_refused_" + reason.rawValue
            result = .refused(.wrongInput)
        }
        if counted, Self.unjudged(result) {
            // The upstream never judged the password (unreachable, slow, asking to wait): the
            // attempt is given back, and the account where this request counted it.
            try? await store.discountAttempt(purpose: Self.failurePurpose, keyHash: accountKey(dialogue), now: now())
            await giveBack(tried.counted)
        }
        switch result {
        case .signedIn, .secondFactor:
            // A right password: the account was not sprayed, wherever it was counted.
            await giveBack(tried.all)
        case .refused(.wrongInput):
            if !counted { _ = try await count(Self.failurePurpose, dialogue) }
            await countFailure(dialogue, reason: failureReason)
            // Back to the password, without the e-mailed code (a new one is sent if the account is over the line).
            dialogue.step = .password
            dialogue.unblockCodeHash = nil
        default:
            break
        }
        return try await outcome(result, dialogue: &dialogue, wrong: .incorrectPassword)
    }

    /// The e-mailed code with the password: the password is relayed only with the right code, which
    /// stays valid while the upstream cannot answer (the same step may be tried again).
    private func unblock(code: String, password: String, dialogue: inout ChallengeDialogue, steps: any InAppSignInSteps, address: String?)
        async throws(OAuthError) -> ChallengeAnswer
    {
        guard let expected = dialogue.unblockCodeHash, let expiresAt = dialogue.unblockExpiresAt, expiresAt > now(),
              SecureToken.constantTimeEquals(SecureToken.hash(code), expected) else {
            return try await wrong(&dialogue, .invalidUnblockCode)
        }
        guard !password.isEmpty, password.utf8.count <= 1024 else { return try await wrong(&dialogue, .incorrectPassword) }
        return try await relay(password, dialogue: &dialogue, steps: steps, address: address, counted: false)
    }

    /// E-mails a fresh 6-digit code to the account and waits for it. When the e-mail cannot go,
    /// the dialogue stays at its step (the password: the app sends it again later).
    private func sendUnblockCode(_ dialogue: inout ChallengeDialogue) async throws(OAuthError) -> ChallengeAnswer {
        guard dialogue.emails <= settings.resends else {
            return try await save(dialogue) { .failed(.tooManyRequests, session: $0, retryAfter: Self.pause) }
        }
        guard let mailer else { return try await save(dialogue) { .failed(.failedToSendEmail, session: $0) } }
        guard try await admitEmail(dialogue) else {
            return try await save(dialogue) { .failed(.tooManyRequests, session: $0, retryAfter: Self.mailPause) }
        }
        let code = Self.sixDigits()
        dialogue.emails += 1
        do {
            try await mailer.send(MailMessage(to: dialogue.login, subject: "Your sign-in code", body: """
                Someone is signing in to your account in the app. If it is you, enter this code:

                    \(code)

                It is valid for \(Int(settings.codeLifetime.inSeconds) / 60) minutes. If it is not you, ignore this message.
                """))
        } catch {
            logger.warning("unblock code could not be e-mailed", metadata: ["error": .string(String(describing: type(of: error)))])
            return try await save(dialogue) { .failed(.failedToSendEmail, session: $0) }
        }
        dialogue.step = .unblockCode
        dialogue.unblockCodeHash = SecureToken.hash(code)
        dialogue.unblockExpiresAt = expiry(after: settings.codeLifetime)
        return try await save(dialogue) { .next(.unblockCode, session: $0) }
    }

    // MARK: Outcomes

    /// What the upstream made of a step: the code, the next step, or the catalog's failure.
    private func outcome(_ result: InAppOutcome, dialogue: inout ChallengeDialogue, wrong failure: InAppFailure)
        async throws(OAuthError) -> ChallengeAnswer
    {
        switch result {
        case .signedIn(let grant):
            try? await store.resetAttempts(purpose: Self.failurePurpose, keyHash: accountKey(dialogue))
            try? await store.resetAttempts(purpose: Self.codePurpose, keyHash: accountKey(dialogue))
            return try await issueCode(grant, dialogue: dialogue)
        case .secondFactor(let token):
            try? await store.resetAttempts(purpose: Self.failurePurpose, keyHash: accountKey(dialogue))
            dialogue.step = .otp
            dialogue.secondFactor = token
            return try await save(dialogue) { .next(.otp, session: $0) }
        case .refused(.wrongInput):
            return try await wrong(&dialogue, failure)
        case .refused(.unusable(let detail)):
            logger.warning("in-app sign-in failed at the upstream", metadata: ["upstream": .string(dialogue.upstream), "reason": .string(detail)])
            return .failed(.authenticationFailure, session: nil, ended: true)
        case .refused(.accountRefused(let reason)):
            // Past a second factor (the e-mailed code, the TOTP code, the e-mailed link): the user is told.
            logger.notice("in-app sign-in: the upstream refused the account", metadata: [
                "upstream": .string(dialogue.upstream), "reason": .string(reason.rawValue),
            ])
            audit.record(.sign_in_failed, clientID: dialogue.clientID, subject: nil, reason: "account_refused_" + reason.rawValue,
                         metadata: ["upstream": .string(dialogue.upstream)])
            return .accountRefused(reason)
        case .refused(let refusal):
            let (failure, retryAfter) = Self.failure(of: refusal)
            return try await save(dialogue) { .failed(failure, session: $0, retryAfter: retryAfter) }
        }
    }

    /// A wrong input: counted; the dialogue ends after `in_app_sign_in.attempts`.
    private func wrong(_ dialogue: inout ChallengeDialogue, _ failure: InAppFailure) async throws(OAuthError) -> ChallengeAnswer {
        dialogue.attempts += 1
        guard dialogue.attempts < settings.attempts else {
            logger.notice("in-app sign-in ended after too many wrong inputs", metadata: ["client_id": .string(dialogue.clientID)])
            return .failed(.tooManyRequests, session: nil, retryAfter: Self.pause, ended: true)
        }
        return try await save(dialogue) { [step = dialogue.step] in .next(step, session: $0, failure: failure) }
    }

    /// The Gatehouse code the dialogue ends with: a browser sign-in's code without a redirect URI,
    /// bound to the dialogue's DPoP key.
    private func issueCode(_ grant: UpstreamGrant, dialogue: ChallengeDialogue) async throws(OAuthError) -> ChallengeAnswer {
        var issued = IssuedCode(clientID: dialogue.clientID, redirectURI: IssuedCode.noRedirectURI, codeChallenge: dialogue.codeChallenge,
                                upstream: dialogue.upstream, tokenResponse: grant.tokens?.json ?? Data("{}".utf8),
                                userinfo: grant.userinfo, appNonce: dialogue.appNonce, subject: grant.subject)
        issued.dpopJKT = dialogue.dpopJKT
        let code = SecureToken.generate()
        do {
            try await store.insertCode(sealed: try issued.sealed(with: code), codeHash: SecureToken.hash(code),
                                       expiresAt: expiry(after: configuration.server.codeLifetime))
        } catch {
            throw .serverError("Gatehouse could not record the sign-in")
        }
        logger.info("code issued to app", metadata: ["client_id": .string(dialogue.clientID), "via": "authorize-challenge"])
        return .code(code)
    }

    /// Keeps the dialogue under a fresh `auth_session` and answers with it.
    private func save(_ dialogue: ChallengeDialogue, answer: (String) -> ChallengeAnswer) async throws(OAuthError) -> ChallengeAnswer {
        let session = SecureToken.generate()
        do {
            try await store.insertTransaction(sealed: try dialogue.sealed(with: session),
                                              stateHash: ChallengeDialogue.storeKey(authSession: session),
                                              expiresAt: expiry(after: settings.sessionLifetime))
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        return answer(session)
    }

    // MARK: Helpers

    /// The store counters of an account: passwords between two successes, second-factor codes, e-mails.
    static let failurePurpose = "in-app-password"
    static let codePurpose = "in-app-code"
    static let mailPurpose = "in-app-mail"

    /// The wait answered when the account's e-mails for the hour are spent.
    static let mailPause = 600

    /// Counts one attempt of `purpose` for the dialogue's account, in the store, within `window`
    /// (the failure window unless said).
    private func count(_ purpose: String, _ dialogue: ChallengeDialogue, window: Duration? = nil) async throws(OAuthError) -> Int {
        do {
            return try await store.countAttempt(purpose: purpose, keyHash: accountKey(dialogue),
                                                expiresAt: expiry(after: window ?? settings.failureWindow), now: now())
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
    }

    /// Whether one more e-mail may go to the dialogue's account this hour (counted in the store,
    /// on every instance, whichever dialogue asks): no address can be flooded through Gatehouse.
    private func admitEmail(_ dialogue: ChallengeDialogue) async throws(OAuthError) -> Bool {
        try await count(Self.mailPurpose, dialogue, window: .seconds(3600)) <= settings.emailsPerHour
    }

    /// The wait a per-dialogue limit answers with (too many wrong inputs, no more e-mails): a pause
    /// before the user starts again; the limits per account and address decide what comes after.
    static let pause = 30

    /// The account's key in the store and the limits: its upstream and login, hashed, the login
    /// folded past what any upstream's collation folds (`AccountSpelling`: case, accents,
    /// compatibility forms, invisible characters), so that `ADA@…`, `ａｄａ@…`, `ädá@…` and
    /// `ad\u{200B}a@…` are one account to every counter.
    func accountKey(_ dialogue: ChallengeDialogue) -> String {
        SecureToken.hash(dialogue.upstream + "\n" + AccountSpelling.folded(dialogue.login))
    }

    /// One token of the account's bucket; the wait in seconds when empty.
    private func takeAccount(_ dialogue: ChallengeDialogue) -> Int? {
        limits.take(.in_app_account, key: accountKey(dialogue), clientID: dialogue.clientID)?.retryAfterSeconds
    }

    /// Whether the client is an install no platform or code has certified: an uncertified
    /// instance of an app with `instances`, or that app's own client id (every install can send it).
    private func uncertified(_ client: AppClient) async throws(OAuthError) -> Bool {
        guard client.instances != nil else { return false }
        guard client.isInstance else { return true }
        let instance: InstanceRecord?
        do {
            instance = try await store.instance(id: client.clientID)
        } catch {
            throw .serverError("Gatehouse cannot reach its store right now")
        }
        return instance?.certification == nil
    }

    /// Whether the upstream refused a step without judging its input (unreachable, slow, asking
    /// to wait): the step may be tried again, and the attempt counted for it is given back.
    static func unjudged(_ result: InAppOutcome) -> Bool {
        switch result {
        case .refused(.unavailable), .refused(.timeout), .refused(.rateLimited): true
        default: false
        }
    }

    static func failure(of refusal: InAppRefusal) -> (InAppFailure, Int?) {
        switch refusal {
        case .rateLimited(let seconds): (.tooManyRequests, seconds)
        case .unavailable: (.serverUnavailable, nil)
        case .timeout: (.requestTimeout, nil)
        case .wrongInput, .unusable, .accountRefused: (.authenticationFailure, nil)
        }
    }

    static func sixDigits() -> String {
        var generator = SystemRandomNumberGenerator()
        return String(format: "%06d", Int.random(in: 0..<1_000_000, using: &generator))
    }
}
