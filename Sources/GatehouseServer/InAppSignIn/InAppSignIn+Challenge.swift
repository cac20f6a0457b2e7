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
        let dialogue = ChallengeDialogue(clientID: client.clientID, upstream: client.upstream, scopes: grant.scopes,
                                         codeChallenge: grant.codeChallenge, appNonce: grant.nonce, login: login, step: .password,
                                         dpopJKT: input.proof?.thumbprint)
        var machine = DialogueMachine(dialogue: dialogue, settings: settings, canMail: mailer != nil)
        return await run(&machine, .begin(steps.firstStep), client: client, steps: steps, input: input)
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
        guard let sealed else {
            logger.info("authorization challenge with an unknown, used or expired auth_session")
            return .invalidSession
        }
        let dialogue: ChallengeDialogue
        do {
            dialogue = try ChallengeDialogue.unsealed(sealed, with: session)
        } catch {
            logger.warning("authorization challenge with an auth_session its dialogue does not open")
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
        let fields = ChallengeStep.inputFields.compactMap { name in input.form[name].map { (name, $0) } }
        let request = DialogueMachine.Request(fields: Dictionary(uniqueKeysWithValues: fields), resend: input.form["resend"], now: now())
        var machine = DialogueMachine(dialogue: dialogue, settings: settings, canMail: mailer != nil)
        return await run(&machine, .request(request), client: client, steps: steps, input: input)
    }
}
