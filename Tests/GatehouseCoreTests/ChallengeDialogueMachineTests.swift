import Foundation
import GatehouseCore
import Testing

/// The in-app dialogue's state machine alone: in each phase, each input, with the effect it
/// returns and the phase it leaves. Effects and phases are compared as short descriptions
/// (`describe`) naming every value the route acts on, and the dialogue as it would be saved.
struct ChallengeDialogueMachineTests {
    /// A grant and a scope as the machine sees them: values it holds and hands back.
    typealias Machine = ChallengeDialogueMachine<String, String>

    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let settings = InAppSignInSettings()  // attempts 5, unblock_after 3, resends 3, emails_per_hour 5

    // MARK: Phases, reached through inputs only

    enum Phase: CaseIterable, Sendable {
        /// A dialogue at the password step, before its request.
        case ready
        /// The password `pw` arrived; the account's bucket is asked.
        case takingAccountToken
        /// …its attempt is being counted.
        case countingPasswords
        /// …one of three so far: is the client certified?
        case checkingCertification
        /// …it is: is the breaker tripped?
        case checkingBreaker
        /// …it is not: the account is counted among those the client tried.
        case admittingAccount
        /// …admitted by the scope `a`: the password is relayed.
        case relayingPassword
        /// The account is over its line: its e-mails of the hour are counted before a code goes.
        case countingEmails
        /// …the first this hour: the code is e-mailed.
        case mailingUnblockCode
        /// A new e-mailed-link dialogue: its first link goes.
        case sendingLink
        /// At the second factor, the code `123456` is being counted for the account.
        case countingCodes
        /// …and relayed.
        case answeringSecondFactor
        /// At the e-mailed link, its code `c` is handed to the upstream.
        case redeemingLinkCode
        /// The upstream was unavailable for the relayed password: the attempt is given back.
        case givingAttemptBack
        /// The password was right: the account is given back to the scope `a`.
        case givingAccountBack
        /// …and the account's counters are reset.
        case resettingCounters
        /// The password was wrong: it is audited and counted toward the breaker.
        case recordingFailure
        /// The password relayed with the unblock code was wrong: it is counted (strictly).
        case countingPasswordAfterCode
        /// The grant `g` is being turned into a Gatehouse code.
        case issuingCode
        /// A new password dialogue is being saved.
        case saving
        /// It was saved and answered.
        case answered
    }

    static func dialogue(_ step: ChallengeStep = .password, login: String = "ada@example.com") -> ChallengeDialogue {
        ChallengeDialogue(clientID: "app", upstream: "up", scopes: ["openid"], codeChallenge: "cc", appNonce: nil, login: login,
                          step: step, dpopJKT: nil)
    }

    /// At the second factor, with the upstream's token `t`.
    static var atSecondFactor: ChallengeDialogue {
        var dialogue = dialogue(.otp)
        dialogue.secondFactor = "t"
        return dialogue
    }

    /// At the e-mailed link, one e-mail sent.
    static var atEmailLink: ChallengeDialogue {
        var dialogue = dialogue(.emailLink)
        dialogue.emails = 1
        return dialogue
    }

    /// At the unblock code `123456`, valid for ten minutes, one e-mail sent.
    static var atUnblockCode: ChallengeDialogue {
        var dialogue = dialogue(.unblockCode)
        dialogue.emails = 1
        dialogue.unblockCodeHash = SecureToken.hash("123456")
        dialogue.unblockExpiresAt = now.addingTimeInterval(600)
        return dialogue
    }

    static func machine(_ dialogue: ChallengeDialogue = dialogue(), settings: InAppSignInSettings = settings, canMail: Bool = true) -> Machine {
        Machine(dialogue: dialogue, settings: settings, canMail: canMail)
    }

    static func request(_ fields: [String: String], resend: String? = nil) -> Machine.Input {
        .request(Machine.Request(fields: fields, resend: resend, now: now))
    }

    static let password = request(["password": "pw"])

    /// Feeds the inputs in order; the last effect.
    @discardableResult
    static func feed(_ machine: inout Machine, _ inputs: Machine.Input...) -> Machine.Effect? {
        var effect: Machine.Effect?
        for input in inputs { effect = machine.receive(input) }
        return effect
    }

    static func machine(in phase: Phase) -> Machine {
        var machine: Machine
        switch phase {
        case .ready, .takingAccountToken, .countingPasswords, .checkingCertification, .checkingBreaker, .admittingAccount, .relayingPassword:
            machine = Self.machine()
            let path: [Machine.Input] = [password, .accountToken(retryAfter: nil), .counted(1), .certification(uncertified: false),
                                         .breaker(tripped: false), .accountAdmitted(all: ["a"], counted: ["a"])]
            let count = [Phase.ready, .takingAccountToken, .countingPasswords, .checkingCertification, .checkingBreaker, .admittingAccount,
                         .relayingPassword].firstIndex(of: phase)!
            for input in path.prefix(count) { feed(&machine, input) }
        case .countingEmails, .mailingUnblockCode:
            machine = Self.machine(in: .countingPasswords)
            feed(&machine, .counted(4))
            if phase == .mailingUnblockCode { feed(&machine, .counted(1)) }
        case .sendingLink:
            machine = Self.machine()
            feed(&machine, .begin(.emailLink), .accountToken(retryAfter: nil), .counted(1))
        case .countingCodes, .answeringSecondFactor:
            machine = Self.machine(atSecondFactor)
            feed(&machine, request(["otp": "123456"]), .accountToken(retryAfter: nil))
            if phase == .answeringSecondFactor { feed(&machine, .counted(1)) }
        case .redeemingLinkCode:
            machine = Self.machine(atEmailLink)
            feed(&machine, request(["email_code": "c"]), .accountToken(retryAfter: nil))
        case .givingAttemptBack:
            machine = Self.machine(in: .relayingPassword)
            feed(&machine, .upstream(.refused(.unavailable)))
        case .givingAccountBack, .resettingCounters, .issuingCode:
            machine = Self.machine(in: .relayingPassword)
            feed(&machine, .upstream(.signedIn("g")))
            if phase != .givingAccountBack { feed(&machine, .done) }
            if phase == .issuingCode { feed(&machine, .done) }
        case .recordingFailure:
            machine = Self.machine(in: .relayingPassword)
            feed(&machine, .upstream(.refused(.wrongInput)))
        case .countingPasswordAfterCode:
            machine = Self.machine(atUnblockCode)
            feed(&machine, request(["unblock_code": "123456", "password": "pw"]), .accountToken(retryAfter: nil), .upstream(.refused(.wrongInput)))
        case .saving, .answered:
            machine = Self.machine()
            feed(&machine, .begin(.password))
            if phase == .answered { feed(&machine, .saved(session: "s1")) }
        }
        return machine
    }

    /// The state each phase is described as.
    static func described(_ phase: Phase) -> String {
        switch phase {
        case .ready: "ready; password a0 e0"
        case .takingAccountToken: "takingAccountToken step; password a0 e0"
        case .countingPasswords: "countingPasswords pw; password a0 e0"
        case .checkingCertification: "checkingCertification pw; password a0 e0"
        case .checkingBreaker: "checkingBreaker pw; password a0 e0"
        case .admittingAccount: "admittingAccount pw; password a0 e0"
        case .relayingPassword: "relayingPassword counted all a counted a; password a0 e0"
        case .countingEmails: "countingEmails unblockCode account; password a0 e0"
        case .mailingUnblockCode: "mailingUnblockCode; password a0 e1"
        case .sendingLink: "sendingLink first; email_link a0 e1"
        case .countingCodes: "countingCodes t 123456; otp a0 e0 2fa"
        case .answeringSecondFactor: "answeringSecondFactor; otp a0 e0 2fa"
        case .redeemingLinkCode: "redeemingLinkCode; email_link a0 e1"
        case .givingAttemptBack: "tidying giveAttemptBack passwords +1 then outcome refused unavailable; password a0 e0"
        case .givingAccountBack: "tidying giveAccountBack a then outcome signedIn g; password a0 e0"
        case .resettingCounters: "tidying resetCounters passwords secondFactorCodes then issue g; password a0 e0"
        case .recordingFailure: "tidying recordFailure incorrect_password then outcome refused wrongInput; password a0 e0"
        case .countingPasswordAfterCode: "tidying countPassword +1 then outcome refused wrongInput; password a0 e1"
        case .issuingCode: "issuingCode; password a0 e0"
        case .saving: "saving next password; password a0 e0"
        case .answered: "answered; password a0 e0"
        }
    }

    /// One cell of the table: in `phase`, the input returns `effect` and leaves `state`
    /// (`nil`: the phase's own state, unchanged).
    struct Row: Sendable, CustomTestStringConvertible {
        let phase: Phase
        let effect: String
        let state: String?

        init(_ phase: Phase, _ effect: String, _ state: String? = nil) {
            self.phase = phase
            self.effect = effect
            self.state = state
        }

        var testDescription: String { "\(phase): \(effect)" }
    }

    /// Every phase takes `input` as its row says; a phase without a row does not wait for it:
    /// the machine answers `outOfOrder` and is done.
    static func check(_ input: Machine.Input, _ rows: [Row], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(Set(rows.map(\.phase)).count == rows.count, "one row per phase", sourceLocation: sourceLocation)
        for phase in Phase.allCases {
            var machine = Self.machine(in: phase)
            let effect = machine.receive(input)
            if let row = rows.first(where: { $0.phase == phase }) {
                #expect(describe(effect) == row.effect, "\(phase)", sourceLocation: sourceLocation)
                #expect(describe(machine) == row.state ?? described(phase), "\(phase)", sourceLocation: sourceLocation)
            } else {
                #expect(describe(effect) == "answer outOfOrder", "\(phase) takes no such input", sourceLocation: sourceLocation)
                #expect(describe(machine).hasPrefix("answered"), "\(phase) takes no such input", sourceLocation: sourceLocation)
            }
        }
    }

    // MARK: Every phase × every input

    @Test func eachPhaseIsReachedAsDescribed() {
        for phase in Phase.allCases {
            #expect(Self.describe(Self.machine(in: phase)) == Self.described(phase), "\(phase)")
        }
    }

    @Test func aDialogueBegins() {
        Self.check(.begin(.password), [Row(.ready, "save", "saving next password; password a0 e0")])
    }

    @Test func aRequestArrives() {
        Self.check(Self.password, [Row(.ready, "takeAccountToken", "takingAccountToken step; password a0 e0")])
    }

    @Test func theAccountsBucketAnswers() {
        Self.check(.accountToken(retryAfter: nil), [Row(.takingAccountToken, "count passwords", "countingPasswords pw; password a0 e0")])
    }

    @Test func theStoreCounts() {
        Self.check(.counted(1), [
            Row(.countingPasswords, "checkCertification", "checkingCertification pw; password a0 e0"),
            Row(.countingEmails, "emailUnblockCode account", "mailingUnblockCode; password a0 e1"),
            Row(.countingCodes, "answerSecondFactor t 123456", "answeringSecondFactor; otp a0 e0 2fa"),
            Row(.countingPasswordAfterCode, "recordFailure incorrect_password",
                "tidying recordFailure incorrect_password then outcome refused wrongInput; password a0 e1"),
        ])
    }

    @Test func theCertificationIsRead() {
        Self.check(.certification(uncertified: false), [Row(.checkingCertification, "checkBreaker", "checkingBreaker pw; password a0 e0")])
    }

    @Test func theBreakerIsRead() {
        Self.check(.breaker(tripped: false), [Row(.checkingBreaker, "admitAccount", "admittingAccount pw; password a0 e0")])
    }

    @Test func theAccountIsAdmitted() {
        Self.check(.accountAdmitted(all: ["a"], counted: ["a"]), [
            Row(.admittingAccount, "relay pw", "relayingPassword counted all a counted a; password a0 e0"),
        ])
    }

    @Test func theAccountIsHeld() {
        Self.check(.accountHeld(.in_app_accounts_per_address, counted: ["a"]), [
            Row(.admittingAccount, "giveAccountBack a", "tidying giveAccountBack a then hold in_app_accounts_per_address; password a0 e0"),
        ])
    }

    @Test func theUpstreamSignsIn() {
        Self.check(.upstream(.signedIn("g")), [
            Row(.relayingPassword, "giveAccountBack a", "tidying giveAccountBack a then outcome signedIn g; password a0 e0"),
            Row(.answeringSecondFactor, "resetCounters passwords secondFactorCodes",
                "tidying resetCounters passwords secondFactorCodes then issue g; otp a0 e0 2fa"),
            Row(.redeemingLinkCode, "resetCounters passwords secondFactorCodes",
                "tidying resetCounters passwords secondFactorCodes then issue g; email_link a0 e1"),
        ])
    }

    @Test func theLinkIsSent() {
        Self.check(.linkSent, [Row(.sendingLink, "save", "saving next email_link; email_link a0 e1")])
    }

    @Test func theLinkIsRefused() {
        Self.check(.linkRefused(.unavailable), [Row(.sendingLink, "answer failed server_unavailable", "answered; email_link a0 e1")])
    }

    @Test func theUnblockCodeIsMailed() {
        Self.check(.unblockCodeMailed(codeHash: "h", expiresAt: Self.now), [
            Row(.mailingUnblockCode, "save", "saving next unblock_code; unblock_code a0 e1 code"),
        ])
    }

    @Test func theMailFails() {
        Self.check(.mailFailed, [Row(.mailingUnblockCode, "save", "saving failed failed_to_send_email; password a0 e1")])
    }

    @Test func aChoreIsDone() {
        Self.check(.done, [
            Row(.givingAttemptBack, "giveAccountBack a", "tidying giveAccountBack a then outcome refused unavailable; password a0 e0"),
            Row(.givingAccountBack, "resetCounters passwords secondFactorCodes",
                "tidying resetCounters passwords secondFactorCodes then issue g; password a0 e0"),
            Row(.resettingCounters, "issueCode g", "issuingCode; password a0 e0"),
            Row(.recordingFailure, "save", "saving next password incorrect_password; password a1 e0"),
        ])
    }

    @Test func theCodeIsIssued() {
        Self.check(.codeIssued("c1"), [Row(.issuingCode, "answer code c1", "answered; password a0 e0")])
    }

    @Test func theDialogueIsSaved() {
        Self.check(.saved(session: "s1"), [Row(.saving, "answer next password s1", "answered; password a0 e0")])
    }

    /// Where the store's count decides what is relayed, sent or kept, nothing more is done;
    /// where it was bookkeeping, the dialogue goes on as if it were done.
    @Test func theStoreFails() {
        Self.check(.storeFailed, [
            Row(.countingPasswords, "answer storeUnavailable", "answered; password a0 e0"),
            Row(.checkingCertification, "answer storeUnavailable", "answered; password a0 e0"),
            Row(.checkingBreaker, "answer storeUnavailable", "answered; password a0 e0"),
            Row(.admittingAccount, "answer storeUnavailable", "answered; password a0 e0"),
            Row(.countingEmails, "answer storeUnavailable", "answered; password a0 e0"),
            Row(.countingCodes, "answer storeUnavailable", "answered; otp a0 e0 2fa"),
            Row(.countingPasswordAfterCode, "answer storeUnavailable", "answered; password a0 e1"),
            Row(.givingAttemptBack, "giveAccountBack a", "tidying giveAccountBack a then outcome refused unavailable; password a0 e0"),
            Row(.givingAccountBack, "resetCounters passwords secondFactorCodes",
                "tidying resetCounters passwords secondFactorCodes then issue g; password a0 e0"),
            Row(.resettingCounters, "issueCode g", "issuingCode; password a0 e0"),
            Row(.recordingFailure, "save", "saving next password incorrect_password; password a1 e0"),
            Row(.issuingCode, "answer codeNotRecorded", "answered; password a0 e0"),
            Row(.saving, "answer storeUnavailable", "answered; password a0 e0"),
        ])
    }
}

// MARK: The rules

extension ChallengeDialogueMachineTests {
    /// From the password's count: what the next inputs lead to.
    static func afterCount(_ count: Int, login: String = "ada@example.com") -> (Machine, String) {
        var machine = Self.machine(Self.dialogue(login: login))
        let effect = feed(&machine, password, .accountToken(retryAfter: nil), .counted(count))
        return (machine, describe(effect))
    }

    @Test func aPasswordWaitsForTheUnblockCodeOnceTheAccountIsOverItsLine() {
        #expect(Self.afterCount(Self.settings.unblockAfter).1 == "checkCertification")
        let (machine, effect) = Self.afterCount(Self.settings.unblockAfter + 1)
        #expect(effect == "count emails")
        #expect(Self.describe(machine) == "countingEmails unblockCode account; password a0 e0")
        // An account that is no address: the browser, nothing relayed nor sent.
        #expect(Self.afterCount(Self.settings.unblockAfter + 1, login: "ada").1 == "answer redirectToWeb")
    }

    @Test(arguments: [
        ([Machine.Input.certification(uncertified: true)], "uncertified"),
        ([.certification(uncertified: false), .breaker(tripped: true)], "breaker"),
        ([.certification(uncertified: false), .breaker(tripped: false), .accountHeld(.in_app_accounts_per_instance, counted: []),],
         "in_app_accounts_per_instance"),
    ])
    func everyReasonToHoldAPasswordSendsTheUnblockCode(inputs: [Machine.Input], reason: String) {
        var (machine, _) = Self.afterCount(1)
        var effect: Machine.Effect?
        for input in inputs { effect = machine.receive(input) }
        #expect(Self.describe(effect) == "count emails")
        #expect(Self.describe(machine) == "countingEmails unblockCode \(reason); password a0 e0")
        #expect(Self.describe(machine.receive(.counted(1))) == "emailUnblockCode \(reason)")
    }

    @Test func wrongInputsEndTheDialogueAtTheAttemptsLimit() {
        var dialogue = Self.dialogue()
        for attempts in 0..<(Self.settings.attempts - 1) {
            dialogue.attempts = attempts
            var machine = Self.machine(dialogue)
            #expect(Self.describe(Self.feed(&machine, Self.request(["password": ""]), .accountToken(retryAfter: nil))) == "save")
            #expect(Self.describe(machine) == "saving next password incorrect_password; password a\(attempts + 1) e0")
        }
        dialogue.attempts = Self.settings.attempts - 1
        var machine = Self.machine(dialogue)
        #expect(Self.describe(Self.feed(&machine, Self.request(["password": ""]), .accountToken(retryAfter: nil))) == "answer ended wrongInputs")
    }

    @Test func anotherStepsInputIsRefusedAndCounted() {
        var machine = Self.machine()
        #expect(Self.describe(machine.receive(Self.request(["otp": "123456"]))) == "save")
        #expect(Self.describe(machine) == "saving wrongShape this sign-in waits for password; password a1 e0")
        #expect(Self.describe(machine.receive(.saved(session: "s1"))) == "answer wrongShape s1 this sign-in waits for password")

        var atCode = Self.machine(Self.atUnblockCode)
        _ = atCode.receive(Self.request(["password": "pw"], resend: "email_link"))
        #expect(Self.describe(atCode)
            == "saving wrongShape this sign-in waits for nothing but resend; resend must be unblock_code at this step; unblock_code a1 e1 code")

        var last = Self.dialogue()
        last.attempts = Self.settings.attempts - 1
        var ending = Self.machine(last)
        #expect(Self.describe(ending.receive(Self.request([:]))) == "answer ended wrongInputs")
    }

    @Test func aStepWaitsWhileTheAccountsBucketIsEmpty() {
        var machine = Self.machine()
        #expect(Self.describe(Self.feed(&machine, Self.password, .accountToken(retryAfter: 7))) == "save")
        #expect(Self.describe(machine) == "saving failed too_many_requests retry 7; password a0 e0")
    }

    @Test func resendsAreLimitedPerDialogue() {
        for (dialogue, counted) in [(Self.atUnblockCode, "countingEmails unblockCode resend"), (Self.atEmailLink, "countingEmails link")] {
            let step = dialogue.step.rawValue
            var within = dialogue
            within.emails = Self.settings.resends
            var machine = Self.machine(within)
            #expect(Self.describe(Self.feed(&machine, Self.request([:], resend: step), .accountToken(retryAfter: nil))) == "count emails")
            #expect(Self.describe(machine).hasPrefix(counted))

            var beyond = dialogue
            beyond.emails = Self.settings.resends + 1
            machine = Self.machine(beyond)
            #expect(Self.describe(Self.feed(&machine, Self.request([:], resend: step), .accountToken(retryAfter: nil))) == "save")
            #expect(Self.describe(machine).hasPrefix("saving failed too_many_requests retry 30"))
        }
    }

    @Test func anAccountGetsItsEmailsOfTheHourWhateverTheDialogues() {
        // A code to an account over its e-mails: the dialogue stays where it is.
        var (machine, _) = Self.afterCount(4)
        #expect(Self.describe(machine.receive(.counted(Self.settings.emailsPerHour + 1))) == "save")
        #expect(Self.describe(machine) == "saving failed too_many_requests retry 600; password a0 e0")
        // A new link dialogue over them is not kept.
        var link = Self.machine()
        #expect(Self.describe(Self.feed(&link, .begin(.emailLink), .accountToken(retryAfter: nil), .counted(Self.settings.emailsPerHour + 1)))
            == "answer failed too_many_requests retry 600")
        // A resent link likewise keeps the dialogue.
        var resent = Self.machine(Self.atEmailLink)
        #expect(Self.describe(Self.feed(&resent, Self.request([:], resend: "email_link"), .accountToken(retryAfter: nil),
                                        .counted(Self.settings.emailsPerHour + 1))) == "save")
        #expect(Self.describe(resent) == "saving failed too_many_requests retry 600; email_link a0 e1")
    }

    @Test func withoutAMailRelayTheUnblockCodeCannotGo() {
        var machine = Self.machine(canMail: false)
        #expect(Self.describe(Self.feed(&machine, Self.password, .accountToken(retryAfter: nil), .counted(4))) == "save")
        #expect(Self.describe(machine) == "saving failed failed_to_send_email; password a0 e0")
    }

    @Test func aNewLinkDialogueNeedsAnAddressAndAToken() {
        var machine = Self.machine(Self.dialogue(login: "ada"))
        #expect(Self.describe(machine.receive(.begin(.emailLink))) == "answer failed invalid_email_address")
        machine = Self.machine()
        #expect(Self.describe(Self.feed(&machine, .begin(.emailLink), .accountToken(retryAfter: 9))) == "answer failed too_many_requests retry 9")
        machine = Self.machine()
        #expect(Self.describe(Self.feed(&machine, .begin(.emailLink), .accountToken(retryAfter: nil), .counted(1), .linkRefused(.rateLimited(retryAfter: 4))))
            == "answer failed too_many_requests retry 4")
    }

    @Test func secondFactorCodesAreCountedPerAccount() {
        var machine = Self.machine(in: .countingCodes)
        #expect(Self.describe(machine.receive(.counted(Self.settings.attempts))) == "answerSecondFactor t 123456")
        machine = Self.machine(in: .countingCodes)
        #expect(Self.describe(machine.receive(.counted(Self.settings.attempts + 1))) == "answer ended secondFactorCodes")
        // A malformed code is a wrong input; no token is an unknown session.
        var malformed = Self.machine(Self.atSecondFactor)
        #expect(Self.describe(Self.feed(&malformed, Self.request(["otp": "12345a"]), .accountToken(retryAfter: nil))) == "save")
        #expect(Self.describe(malformed) == "saving next otp invalid_totp_code; otp a1 e0 2fa")
        var tokenless = Self.machine(Self.dialogue(.otp))
        #expect(Self.describe(Self.feed(&tokenless, Self.request(["otp": "123456"]), .accountToken(retryAfter: nil))) == "answer invalidSession")
    }

    @Test(arguments: [
        (InAppRefusal.unavailable, "saving failed server_unavailable"),
        (.timeout, "saving failed request_timeout"),
        (.rateLimited(retryAfter: 7), "saving failed too_many_requests retry 7"),
    ])
    func anUnjudgedStepGivesItsAttemptBack(refusal: InAppRefusal, saving: String) {
        var machine = Self.machine(in: .relayingPassword)
        #expect(Self.describe(machine.receive(.upstream(.refused(refusal)))) == "giveAttemptBack passwords")
        #expect(Self.describe(machine.receive(.done)) == "giveAccountBack a")
        #expect(Self.describe(machine.receive(.done)) == "save")
        #expect(Self.describe(machine) == saving + "; password a0 e0")

        var code = Self.machine(in: .answeringSecondFactor)
        #expect(Self.describe(code.receive(.upstream(.refused(refusal)))) == "giveAttemptBack secondFactorCodes")
        #expect(Self.describe(code.receive(.storeFailed)) == "save")
        #expect(Self.describe(code) == saving + "; otp a0 e0 2fa")

        // With the unblock code nothing was counted before the relay: nothing is given back,
        // and the code stays valid for another try.
        var unblocked = Self.machine(Self.atUnblockCode)
        let relayed = Self.feed(&unblocked, Self.request(["unblock_code": "123456", "password": "pw"]), .accountToken(retryAfter: nil),
                                .upstream(.refused(refusal)))
        #expect(Self.describe(relayed) == "save")
        #expect(Self.describe(unblocked) == saving + "; unblock_code a0 e1 code")
    }

    @Test(arguments: AccountRefusal.allCases)
    func anAccountRefusalIsAWrongPasswordUntilASecondFactor(refusal: AccountRefusal) {
        var machine = Self.machine(in: .relayingPassword)
        #expect(Self.describe(machine.receive(.upstream(.refused(.accountRefused(refusal))))) == "recordFailure account_refused_\(refusal.rawValue)")
        #expect(Self.describe(machine.receive(.done)) == "save")
        #expect(Self.describe(machine) == "saving next password incorrect_password; password a1 e0")

        // Past the unblock code, the TOTP code or the e-mailed link: told.
        var unblocked = Self.machine(Self.atUnblockCode)
        #expect(Self.describe(Self.feed(&unblocked, Self.request(["unblock_code": "123456", "password": "pw"]), .accountToken(retryAfter: nil),
                                        .upstream(.refused(.accountRefused(refusal))))) == "answer accountRefused \(refusal.rawValue)")
        for phase in [Phase.answeringSecondFactor, .redeemingLinkCode] {
            var told = Self.machine(in: phase)
            #expect(Self.describe(told.receive(.upstream(.refused(.accountRefused(refusal))))) == "answer accountRefused \(refusal.rawValue)")
        }
    }

    @Test func aWrongPasswordAfterTheUnblockCodeIsCountedAndAsksForANewCode() {
        var machine = Self.machine(in: .countingPasswordAfterCode)
        #expect(Self.describe(machine.receive(.counted(5))) == "recordFailure incorrect_password")
        #expect(Self.describe(machine.receive(.done)) == "save")
        #expect(Self.describe(machine) == "saving next password incorrect_password; password a1 e1")
    }

    @Test func theUnblockCodeIsCheckedAndExpires() {
        let cases: [(Machine.Input, String)] = [
            (Self.request(["unblock_code": "654321", "password": "pw"]), "saving next unblock_code invalid_unblock_code"),
            (.request(Machine.Request(fields: ["unblock_code": "123456", "password": "pw"], now: Self.now.addingTimeInterval(600))),
             "saving next unblock_code invalid_unblock_code"),
            (Self.request(["unblock_code": "123456", "password": ""]), "saving next unblock_code incorrect_password"),
        ]
        for (request, saving) in cases {
            var machine = Self.machine(Self.atUnblockCode)
            #expect(Self.describe(Self.feed(&machine, request, .accountToken(retryAfter: nil))) == "save")
            #expect(Self.describe(machine) == saving + "; unblock_code a1 e1 code")
        }
        var right = Self.machine(Self.atUnblockCode)
        #expect(Self.describe(Self.feed(&right, Self.request(["unblock_code": "123456", "password": "pw"]), .accountToken(retryAfter: nil)))
            == "relay pw")
        #expect(Self.describe(right) == "relayingPassword uncounted; unblock_code a0 e1 code")
    }

    @Test func aRightPasswordAsksForTheSecondFactor() {
        var machine = Self.machine(in: .relayingPassword)
        #expect(Self.describe(machine.receive(.upstream(.secondFactor(token: "t2")))) == "giveAccountBack a")
        #expect(Self.describe(machine.receive(.done)) == "resetCounters passwords")
        #expect(Self.describe(machine.receive(.storeFailed)) == "save")
        #expect(Self.describe(machine) == "saving next otp; otp a0 e0 2fa")
        #expect(machine.dialogue.secondFactor == "t2")
    }

    @Test func anUnusableAnswerEndsTheDialogue() {
        var machine = Self.machine(in: .redeemingLinkCode)
        #expect(Self.describe(machine.receive(.upstream(.refused(.unusable("expired"))))) == "answer upstreamUnusable expired")
    }

    @Test func theMachineHoldsNoSecretItWasNotGiven() {
        // The unblock code's hash and end come from the route; the machine keeps them as given.
        var machine = Self.machine(in: .mailingUnblockCode)
        _ = machine.receive(.unblockCodeMailed(codeHash: "h", expiresAt: Self.now))
        #expect(machine.dialogue.unblockCodeHash == "h")
        #expect(machine.dialogue.unblockExpiresAt == Self.now)
    }
}

// MARK: Descriptions

extension ChallengeDialogueMachineTests {
    static func describe(_ effect: Machine.Effect?) -> String {
        guard let effect else { return "nil" }
        switch effect {
        case .takeAccountToken: return "takeAccountToken"
        case .countAttempt(let counter): return "count \(counter)"
        case .checkCertification: return "checkCertification"
        case .checkBreaker: return "checkBreaker"
        case .admitAccount: return "admitAccount"
        case .relayPassword(let password): return "relay \(password)"
        case .answerSecondFactor(let token, let otp): return "answerSecondFactor \(token) \(otp)"
        case .redeemEmailCode(let code): return "redeem \(code)"
        case .sendEmailLink: return "sendEmailLink"
        case .emailUnblockCode(let hold): return "emailUnblockCode \(hold?.reason ?? "resend")"
        case .giveAttemptBack(let counter): return "giveAttemptBack \(counter)"
        case .giveAccountBack(let scopes): return "giveAccountBack \(scopes.joined(separator: ","))"
        case .recordFailure(let reason): return "recordFailure \(reason.reason)"
        case .resetCounters(let counters): return "resetCounters " + counters.map { "\($0)" }.joined(separator: " ")
        case .issueCode(let grant): return "issueCode \(grant)"
        case .save: return "save"
        case .answer(let reply): return "answer " + describe(reply)
        }
    }

    static func describe(_ reply: Machine.Reply) -> String {
        switch reply {
        case .code(let code): "code \(code)"
        case .next(let step, let session, let failure): "next \(step.rawValue) \(session)" + (failure.map { " \($0.rawValue)" } ?? "")
        case .failed(let failure, let session, let retryAfter):
            "failed \(failure.rawValue)" + (session.map { " \($0)" } ?? "") + (retryAfter.map { " retry \($0)" } ?? "")
        case .ended(let ending): "ended \(ending)"
        case .wrongShape(let detail, let session): "wrongShape \(session) \(detail)"
        case .accountRefused(let refusal): "accountRefused \(refusal.rawValue)"
        case .upstreamUnusable(let detail): "upstreamUnusable \(detail)"
        case .redirectToWeb: "redirectToWeb"
        case .invalidSession: "invalidSession"
        case .storeUnavailable: "storeUnavailable"
        case .codeNotRecorded: "codeNotRecorded"
        case .outOfOrder: "outOfOrder"
        }
    }

    static func describe(_ saved: Machine.Saved) -> String {
        switch saved {
        case .next(let step, let failure): "next \(step.rawValue)" + (failure.map { " \($0.rawValue)" } ?? "")
        case .failed(let failure, let retryAfter): "failed \(failure.rawValue)" + (retryAfter.map { " retry \($0)" } ?? "")
        case .wrongShape(let detail): "wrongShape \(detail)"
        }
    }

    static func describe(_ chore: Machine.Chore) -> String {
        switch chore {
        case .giveAttemptBack(let counter): "giveAttemptBack \(counter)"
        case .giveAccountBack(let scopes): "giveAccountBack \(scopes.joined(separator: ","))"
        case .countPassword: "countPassword"
        case .recordFailure(let reason): "recordFailure \(reason.reason)"
        case .resetCounters(let counters): "resetCounters " + counters.map { "\($0)" }.joined(separator: " ")
        }
    }

    static func describe(_ settlement: Machine.Settlement) -> String {
        switch settlement {
        case .outcome(.signedIn(let grant), _): "outcome signedIn \(grant)"
        case .outcome(.secondFactor(let token), _): "outcome secondFactor \(token)"
        case .outcome(.refused(let refusal), _): "outcome refused \(refusal)"
        case .issue(let grant): "issue \(grant)"
        case .askSecondFactor(let token): "askSecondFactor \(token)"
        case .hold(let hold): "hold \(hold.reason)"
        }
    }

    /// The phase, then the dialogue as it would be saved: its step, wrong inputs, e-mails, and
    /// whether it holds an unblock code and a second-factor token.
    static func describe(_ machine: Machine) -> String {
        let phase: String = switch machine.state {
        case .ready: "ready"
        case .takingAccountToken(.firstLink): "takingAccountToken firstLink"
        case .takingAccountToken(.step): "takingAccountToken step"
        case .countingPasswords(let password): "countingPasswords \(password)"
        case .checkingCertification(let password): "checkingCertification \(password)"
        case .checkingBreaker(let password): "checkingBreaker \(password)"
        case .admittingAccount(let password): "admittingAccount \(password)"
        case .relayingPassword(let counted, let tried):
            counted ? "relayingPassword counted all \(tried.all.joined(separator: ",")) counted \(tried.counted.joined(separator: ","))"
                : "relayingPassword uncounted"
        case .countingEmails(.firstLink): "countingEmails firstLink"
        case .countingEmails(.link): "countingEmails link"
        case .countingEmails(.unblockCode(let hold)): "countingEmails unblockCode \(hold?.reason ?? "resend")"
        case .mailingUnblockCode: "mailingUnblockCode"
        case .sendingLink(let first): "sendingLink \(first ? "first" : "again")"
        case .countingCodes(let token, let otp): "countingCodes \(token) \(otp)"
        case .answeringSecondFactor: "answeringSecondFactor"
        case .redeemingLinkCode: "redeemingLinkCode"
        case .tidying(let chore, let rest, let then):
            "tidying \(describe(chore))" + (rest.isEmpty ? "" : " +\(rest.count)") + " then \(describe(then))"
        case .issuingCode: "issuingCode"
        case .saving(let saved): "saving \(describe(saved))"
        case .answered: "answered"
        }
        let dialogue = machine.dialogue
        return "\(phase); \(dialogue.step.rawValue) a\(dialogue.attempts) e\(dialogue.emails)"
            + (dialogue.unblockCodeHash == nil ? "" : " code") + (dialogue.secondFactor == nil ? "" : " 2fa")
    }
}
