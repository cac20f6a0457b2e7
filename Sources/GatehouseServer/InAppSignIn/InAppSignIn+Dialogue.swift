import Foundation
import GatehouseCore
import GatehouseUpstreams
import Logging

// The dialogue's effects: `ChallengeDialogueMachine` decides, this carries out what it says (the
// store, the mail relay, the upstream, the limits in memory) and feeds the results back until
// it answers. A store that fails here is reported to the machine, never swallowed.

extension InAppSignIn {
    typealias DialogueMachine = ChallengeDialogueMachine<UpstreamGrant, AccountScope>

    /// Carries out the machine's effects, from `first`, until it answers.
    func run(_ machine: inout DialogueMachine, _ first: DialogueMachine.Input, client: AppClient, steps: any InAppSignInSteps,
             input: ChallengeInput) async -> ChallengeAnswer
    {
        var effect = machine.receive(first)
        while true {
            if case .answer(let reply) = effect { return answer(reply, dialogue: machine.dialogue) }
            let result = await perform(effect, dialogue: machine.dialogue, client: client, steps: steps, input: input)
            effect = machine.receive(result)
        }
    }

    private func perform(_ effect: DialogueMachine.Effect, dialogue: ChallengeDialogue, client: AppClient, steps: any InAppSignInSteps,
                         input: ChallengeInput) async -> DialogueMachine.Input
    {
        switch effect {
        case .takeAccountToken:
            return .accountToken(retryAfter: takeAccount(dialogue))
        case .countAttempt(let counter):
            return await storing("count \(counter)", dialogue) {
                .counted(try await store.countAttempt(purpose: Self.purpose(of: counter), keyHash: accountKey(dialogue),
                                                      expiresAt: expiry(after: window(of: counter)), now: now()))
            }
        case .checkCertification:
            return await storing("read the instance", dialogue) { .certification(uncertified: try await uncertified(client)) }
        case .checkBreaker:
            return await storing("read the breaker", dialogue) { .breaker(tripped: try await breakerTripped(dialogue)) }
        case .admitAccount:
            return await storing("count the accounts tried", dialogue) {
                switch try await admitAccount(dialogue, client: client, address: input.address) {
                case .admitted(let all, let counted): return .accountAdmitted(all: all, counted: counted)
                case .refused(let scope, let counted): return .accountHeld(scope.limit, counted: counted)
                }
            }
        case .relayPassword(let password):
            return .upstream(await steps.password(login: dialogue.login, password: password, scopes: dialogue.scopes,
                                                  clientAddress: input.resolvedAddress))
        case .answerSecondFactor(let token, let otp):
            return .upstream(await steps.secondFactor(token: token, otp: otp, clientAddress: input.resolvedAddress))
        case .redeemEmailCode(let code):
            return .upstream(await steps.emailCode(code, for: dialogue.login))
        case .sendEmailLink:
            if let refusal = await steps.sendEmailLink(to: dialogue.login, clientAddress: input.address) { return .linkRefused(refusal) }
            return .linkSent
        case .emailUnblockCode(let hold):
            return await emailUnblockCode(dialogue, because: hold)
        case .giveAttemptBack(let counter):
            return await storing("give back \(counter)", dialogue) {
                try await store.discountAttempt(purpose: Self.purpose(of: counter), keyHash: accountKey(dialogue), now: now())
                return .done
            }
        case .giveAccountBack(let scopes):
            return await storing("give the account back", dialogue) {
                try await giveBack(scopes)
                return .done
            }
        case .recordFailure(let reason):
            if case .accountRefused(let refusal) = reason {
                logger.notice("in-app sign-in: the upstream refused the account; answered as a wrong password until a second factor",
                              metadata: ["upstream": .string(dialogue.upstream), "reason": .string(refusal.rawValue)])
            }
            return await storing("count toward the breaker", dialogue) {
                try await countFailure(dialogue, reason: reason.reason)
                return .done
            }
        case .resetCounters(let counters):
            return await storing("reset the counters", dialogue) {
                try await resetCounters(counters, dialogue)
                return .done
            }
        case .issueCode(let grant):
            return await storing("record the code", dialogue) { .codeIssued(try await issueCode(grant, dialogue: dialogue)) }
        case .save(let kept):
            return await storing("save the dialogue", dialogue) { .saved(session: try await save(kept)) }
        case .answer:
            return .done  // never carried out: `run` answers first
        }
    }

    /// The store's result, or `storeFailed`, logged: the machine decides what the user is told.
    private func storing(_ what: String, _ dialogue: ChallengeDialogue,
                         _ body: () async throws -> DialogueMachine.Input) async -> DialogueMachine.Input
    {
        do {
            return try await body()
        } catch {
            logger.warning("in-app sign-in: the store failed", metadata: [
                "client_id": .string(dialogue.clientID), "effect": .string(what),
                "error": .string(String(describing: type(of: error))),
            ])
            return .storeFailed
        }
    }

    /// The machine's reply as the endpoint's answer, logged and audited.
    private func answer(_ reply: DialogueMachine.Reply, dialogue: ChallengeDialogue) -> ChallengeAnswer {
        switch reply {
        case .code(let code):
            return .code(code)
        case .next(let step, let session, let failure):
            return .next(step, session: session, failure: failure)
        case .failed(let failure, let session, let retryAfter):
            return .failed(failure, session: session, retryAfter: retryAfter)
        case .ended(let ending):
            let message: Logger.Message = switch ending {
            case .wrongInputs: "in-app sign-in ended after too many wrong inputs"
            case .secondFactorCodes: "in-app sign-in refused: too many second-factor codes for the account"
            }
            logger.notice(message, metadata: ["client_id": .string(dialogue.clientID)])
            return .failed(.tooManyRequests, session: nil, retryAfter: DialogueMachine.pause, ended: true)
        case .wrongShape(let detail, let session):
            return .refused(.invalidRequest(detail), session: session)
        case .accountRefused(let reason):
            logger.notice("in-app sign-in: the upstream refused the account", metadata: [
                "upstream": .string(dialogue.upstream), "reason": .string(reason.rawValue),
            ])
            audit.record(.sign_in_failed, clientID: dialogue.clientID, subject: nil, reason: "account_refused_" + reason.rawValue,
                         metadata: ["upstream": .string(dialogue.upstream)])
            return .accountRefused(reason)
        case .upstreamUnusable(let detail):
            logger.warning("in-app sign-in failed at the upstream", metadata: ["upstream": .string(dialogue.upstream), "reason": .string(detail)])
            return .failed(.authenticationFailure, session: nil, ended: true)
        case .redirectToWeb:
            return .redirectToWeb(requestURI: nil, expiresIn: 0)
        case .invalidSession:
            return .invalidSession
        case .storeUnavailable:
            return .refused(.serverError("Gatehouse cannot reach its store right now"))
        case .codeNotRecorded:
            return .refused(.serverError("Gatehouse could not record the sign-in"))
        case .outOfOrder:
            logger.error("in-app sign-in: an effect's result came out of order", metadata: ["client_id": .string(dialogue.clientID)])
            return .refused(.serverError("Gatehouse could not go on with this sign-in"))
        }
    }

    // MARK: Effects

    /// E-mails a fresh 6-digit code to the account; its hash and end of validity go in the dialogue.
    private func emailUnblockCode(_ dialogue: ChallengeDialogue, because hold: DialogueMachine.Hold?) async -> DialogueMachine.Input {
        if let hold {
            logger.notice("in-app sign-in asks for an unblock code", metadata: ["client_id": .string(dialogue.clientID), "because": .string(hold.reason)])
        }
        guard let mailer else { return .mailFailed }
        let code = Self.sixDigits()
        do {
            try await mailer.send(MailMessage(to: dialogue.login, subject: "Your sign-in code", body: """
                Someone is signing in to your account in the app. If it is you, enter this code:

                    \(code)

                It is valid for \(Int(settings.codeLifetime.inSeconds) / 60) minutes. If it is not you, ignore this message.
                """))
        } catch {
            logger.warning("unblock code could not be e-mailed", metadata: ["error": .string(String(describing: type(of: error)))])
            return .mailFailed
        }
        return .unblockCodeMailed(codeHash: SecureToken.hash(code), expiresAt: expiry(after: settings.codeLifetime))
    }

    /// The Gatehouse code the dialogue ends with: a browser sign-in's code without a redirect URI,
    /// bound to the dialogue's DPoP key.
    private func issueCode(_ grant: UpstreamGrant, dialogue: ChallengeDialogue) async throws -> String {
        var issued = IssuedCode(clientID: dialogue.clientID, redirectURI: IssuedCode.noRedirectURI, codeChallenge: dialogue.codeChallenge,
                                upstream: dialogue.upstream, tokenResponse: grant.tokens?.json ?? Data("{}".utf8),
                                userinfo: grant.userinfo, appNonce: dialogue.appNonce, subject: grant.subject)
        issued.dpopJKT = dialogue.dpopJKT
        let code = try await recordCode(issued)
        logger.info("code issued to app", metadata: ["client_id": .string(dialogue.clientID), "via": "authorize-challenge"])
        return code
    }

    /// Keeps the dialogue under a fresh `auth_session`, returned.
    private func save(_ dialogue: ChallengeDialogue) async throws -> String {
        let session = SecureToken.generate()
        try await store.insertTransaction(sealed: try dialogue.sealed(with: session), stateHash: ChallengeDialogue.storeKey(authSession: session),
                                          expiresAt: expiry(after: settings.sessionLifetime))
        return session
    }

    /// Resets each counter, all of them even when one fails (the first failure is thrown).
    private func resetCounters(_ counters: [DialogueMachine.Counter], _ dialogue: ChallengeDialogue) async throws {
        var failure: (any Error)?
        for counter in counters {
            do {
                try await store.resetAttempts(purpose: Self.purpose(of: counter), keyHash: accountKey(dialogue))
            } catch {
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
    }

    // MARK: Helpers

    /// The store counters of an account: passwords between two successes, second-factor codes, e-mails.
    static let failurePurpose = "in-app-password"
    static let codePurpose = "in-app-code"
    static let mailPurpose = "in-app-mail"

    static func purpose(of counter: DialogueMachine.Counter) -> String {
        switch counter {
        case .passwords: failurePurpose
        case .secondFactorCodes: codePurpose
        case .emails: mailPurpose
        }
    }

    /// A counter's window: the failure window, an hour for e-mails.
    func window(of counter: DialogueMachine.Counter) -> Duration {
        counter == .emails ? .seconds(3600) : settings.failureWindow
    }

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
    private func uncertified(_ client: AppClient) async throws -> Bool {
        guard client.instances != nil else { return false }
        guard client.isInstance else { return true }
        return try await store.instance(id: client.clientID)?.certification == nil
    }

    static func sixDigits() -> String {
        var generator = SystemRandomNumberGenerator()
        return String(format: "%06d", Int.random(in: 0..<1_000_000, using: &generator))
    }
}
