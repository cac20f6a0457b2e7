import Foundation

// The rules of each step: what a request may carry, when a password waits for the e-mailed
// code, what the upstream's answer leads to, and the per-dialogue limits.

extension ChallengeDialogueMachine {
    // MARK: Requests

    /// A new dialogue. At the password step nothing is checked against the upstream yet: a known
    /// and an unknown account answer alike. An e-mailed link goes at once, to an address only.
    mutating func begin(_ first: InAppFirstStep) -> Effect {
        switch first {
        case .password:
            return save(.next(.password, failure: nil))
        case .emailLink:
            guard EmailAddress.isValid(dialogue.login) else { return answer(.failed(.invalidEmailAddress, session: nil, retryAfter: nil)) }
            return wait(.takingAccountToken(then: .firstLink), .takeAccountToken)
        }
    }

    /// One step at a time: another step's input (an otp before the password), or a resend of
    /// another step, is refused and counted as a wrong input.
    mutating func check(_ request: Request) -> Effect {
        let present = Set(request.fields.keys)
        let resend = request.resend
        let expected: Set<String> = switch dialogue.step {
        case .unblockCode: resend == nil ? ["unblock_code", "password"] : []
        case .emailLink: resend == nil ? ["email_code"] : []
        case .password, .otp: [dialogue.step.field]
        }
        let resendable = (dialogue.step == .unblockCode || dialogue.step == .emailLink) && resend == dialogue.step.rawValue
        guard present == expected, resend == nil || resendable else {
            dialogue.attempts += 1
            guard dialogue.attempts < settings.attempts else { return answer(.ended(.wrongInputs)) }
            let detail = "this sign-in waits for \(expected.isEmpty ? "nothing but resend" : expected.sorted().joined(separator: " and "))"
                + (resend == nil || resendable ? "" : "; resend must be \(dialogue.step.rawValue) at this step")
            return save(.wrongShape(detail: detail))
        }
        return wait(.takingAccountToken(then: .step(request)), .takeAccountToken)
    }

    mutating func tokenTaken(_ then: AfterToken, retryAfter wait: Int?) -> Effect {
        switch then {
        case .firstLink:
            if let wait { return answer(.failed(.tooManyRequests, session: nil, retryAfter: wait)) }
            return self.wait(.countingEmails(for: .firstLink), .countAttempt(.emails))
        case .step(let request):
            if let wait { return save(.failed(.tooManyRequests, retryAfter: wait)) }
            return dispatch(request)
        }
    }

    /// The current step with the request's input, its shape checked.
    mutating func dispatch(_ request: Request) -> Effect {
        let fields = request.fields
        switch dialogue.step {
        case .password:
            let password = fields["password"] ?? ""
            guard Self.acceptable(password: password) else { return wrong(.incorrectPassword) }
            // Counted in the store before anything is relayed: dialogues racing on one account, on
            // any instance, relay at most `unblock_after` passwords per window between two successes.
            return wait(.countingPasswords(password: password), .countAttempt(.passwords))
        case .unblockCode:
            if request.resend != nil { return sendUnblockCode(because: nil) }
            // The password is relayed only with the right code, which stays valid while the
            // upstream cannot answer (the same step may be tried again).
            guard let expected = dialogue.unblockCodeHash, let expiresAt = dialogue.unblockExpiresAt, expiresAt > request.now,
                  SecureToken.constantTimeEquals(SecureToken.hash(fields["unblock_code"] ?? ""), expected) else {
                return wrong(.invalidUnblockCode)
            }
            let password = fields["password"] ?? ""
            guard Self.acceptable(password: password) else { return wrong(.incorrectPassword) }
            return wait(.relayingPassword(counted: false, tried: .none), .relayPassword(password))
        case .otp:
            let otp = fields["otp"] ?? ""
            guard otp.utf8.count == 6, otp.allSatisfy(\.isASCII), otp.allSatisfy(\.isNumber) else { return wrong(.invalidTOTPCode) }
            guard let token = dialogue.secondFactor else { return answer(.invalidSession) }
            // Counted per account in the store before one is relayed: however many dialogues run
            // at once, an account gets `attempts` codes per window.
            return wait(.countingCodes(token: token, otp: otp), .countAttempt(.secondFactorCodes))
        case .emailLink:
            if request.resend != nil {
                guard dialogue.emails <= settings.resends else { return save(.failed(.tooManyRequests, retryAfter: Self.pause)) }
                return wait(.countingEmails(for: .link), .countAttempt(.emails))
            }
            let code = fields["email_code"] ?? ""
            guard !code.isEmpty, code.utf8.count <= 512 else { return wrong(.invalidEmailCode) }
            return wait(.redeemingLinkCode, .redeemEmailCode(code))
        }
    }

    static func acceptable(password: String) -> Bool {
        !password.isEmpty && password.utf8.count <= 1024
    }

    // MARK: E-mails

    /// The password waits for the e-mailed code; without an address to send one to, the browser
    /// sign-in, with the upstream's own defences.
    mutating func hold(_ hold: Hold) -> Effect {
        guard EmailAddress.isValid(dialogue.login) else { return answer(.redirectToWeb) }
        return sendUnblockCode(because: hold)
    }

    /// A fresh code, within the dialogue's resends and the account's e-mails of the hour. When
    /// the e-mail cannot go, the dialogue stays at its step (the app sends the password again later).
    mutating func sendUnblockCode(because hold: Hold?) -> Effect {
        guard dialogue.emails <= settings.resends else { return save(.failed(.tooManyRequests, retryAfter: Self.pause)) }
        guard canMail else { return save(.failed(.failedToSendEmail, retryAfter: nil)) }
        return wait(.countingEmails(for: .unblockCode(because: hold)), .countAttempt(.emails))
    }

    /// The account's e-mails are counted in the store, on every instance, whichever dialogue
    /// asks: no address can be flooded through Gatehouse.
    mutating func emailsCounted(_ count: Int, for mail: Mail) -> Effect {
        guard count <= settings.emailsPerHour else {
            if mail == .firstLink { return answer(.failed(.tooManyRequests, session: nil, retryAfter: Self.mailPause)) }
            return save(.failed(.tooManyRequests, retryAfter: Self.mailPause))
        }
        switch mail {
        case .firstLink:
            dialogue.step = .emailLink
            dialogue.emails = 1
            return wait(.sendingLink(first: true), .sendEmailLink)
        case .link:
            dialogue.emails += 1
            return wait(.sendingLink(first: false), .sendEmailLink)
        case .unblockCode(let hold):
            dialogue.emails += 1
            return wait(.mailingUnblockCode, .emailUnblockCode(because: hold))
        }
    }

    // MARK: The upstream's answers

    /// The upstream's answer to a password; `counted`: the attempt is in the account's count
    /// already (no unblock code passed).
    mutating func relayed(_ outcome: InAppStepOutcome<Grant>, counted: Bool, tried: Tried) -> Effect {
        var outcome = outcome
        var reason = FailureReason.incorrectPassword
        // The upstream refused the account, perhaps after its right password. Until a second
        // factor is passed this is a wrong password (the same answer, counted as one): the user
        // meets the unblock code after `unblock_after` tries, and is told after it.
        if counted, case .refused(.accountRefused(let refusal)) = outcome {
            reason = .accountRefused(refusal)
            outcome = .refused(.wrongInput)
        }
        var chores: [Chore] = []
        if counted, Self.unjudged(outcome) {
            // Never judged: the attempt is given back, and the account where this request counted it.
            chores.append(.giveAttemptBack(.passwords))
            if !tried.counted.isEmpty { chores.append(.giveAccountBack(tried.counted)) }
        }
        switch outcome {
        case .signedIn, .secondFactor:
            // A right password: the account was not sprayed, wherever it was counted.
            if !tried.all.isEmpty { chores.append(.giveAccountBack(tried.all)) }
        case .refused(.wrongInput):
            if !counted { chores.append(.countPassword) }
            chores.append(.recordFailure(reason))
            // Back to the password, without the e-mailed code (a new one is sent if the account is over the line).
            dialogue.step = .password
            dialogue.unblockCodeHash = nil
        case .refused:
            break
        }
        return tidy(chores, then: .outcome(outcome, wrong: .incorrectPassword))
    }

    mutating func settle(_ settlement: Settlement) -> Effect {
        switch settlement {
        case .issue(let grant):
            return wait(.issuingCode, .issueCode(grant))
        case .askSecondFactor(let token):
            dialogue.step = .otp
            dialogue.secondFactor = token
            return save(.next(.otp, failure: nil))
        case .hold(let hold):
            return self.hold(hold)
        case .outcome(.signedIn(let grant), _):
            return tidy([.resetCounters([.passwords, .secondFactorCodes])], then: .issue(grant))
        case .outcome(.secondFactor(let token), _):
            return tidy([.resetCounters([.passwords])], then: .askSecondFactor(token: token))
        case .outcome(.refused(.wrongInput), let failure):
            return wrong(failure)
        case .outcome(.refused(.unusable(let detail)), _):
            return answer(.upstreamUnusable(detail: detail))
        case .outcome(.refused(.accountRefused(let refusal)), _):
            // Past a second factor (the e-mailed code, the TOTP code, the e-mailed link): the user is told.
            return answer(.accountRefused(refusal))
        case .outcome(.refused(let refusal), _):
            let (failure, retryAfter) = refusal.failure
            return save(.failed(failure, retryAfter: retryAfter))
        }
    }

    /// A wrong input: counted; the dialogue ends after `in_app_sign_in.attempts`.
    mutating func wrong(_ failure: InAppFailure) -> Effect {
        dialogue.attempts += 1
        guard dialogue.attempts < settings.attempts else { return answer(.ended(.wrongInputs)) }
        return save(.next(dialogue.step, failure: failure))
    }
}
