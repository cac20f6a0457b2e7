import Foundation
import GatehouseCore
@testable import GatehouseServer
import NIOCore
import NIOHTTP1
import Testing

/// The fast path's state machine alone: in each phase, each event, with the action it returns
/// and the state it leaves. Actions and states are compared as short
/// descriptions (`describe`), which name every field the handler acts on.
struct FastRelayStateMachineTests {
    typealias Machine = FastRelayStateMachine<Backend>

    /// A backend connection as the machine sees one: a value it holds and hands back.
    struct Backend: CustomStringConvertible {
        let id: Int
        var description: String { "b\(id)" }
    }

    static let b1 = Backend(id: 1)
    static let b2 = Backend(id: 2)
    static let b9 = Backend(id: 9)
    static let ok = HTTPResponseHead(version: .http1_1, status: .ok)

    // MARK: Phases, reached through events only

    enum Phase: CaseIterable, Sendable {
        /// Nothing under way.
        case idle
        /// Hummingbird's request `/general` is being read.
        case general
        /// The fast POST `/fast/p` announced 6 bytes and sent 3.
        case collecting
        /// The fast GET `/fast/1` was answered 502 before its `.end` was read.
        case swallowing
        /// The fast GET `/fast/1` (read whole), DPoP-bound, waits for the store to record its
        /// proof's first use: no backend is asked yet.
        case admitting
        /// The fast GET `/fast/1` (read whole) waits for a new connection.
        case connecting
        /// …was sent on `b1`.
        case awaitingHead
        /// …is answered 200.
        case streaming
        /// …and the app takes the answer slower than `b1` sends it.
        case paused
    }

    static func machine(in phase: Phase, maximumQueuedParts: Int = 256) -> Machine {
        var machine = Machine(maximumQueuedParts: maximumQueuedParts)
        switch phase {
        case .idle:
            break
        case .general:
            _ = plan(&machine, head("/general"))
        case .collecting:
            _ = plan(&machine, head("/fast/p", .POST, length: 6))
            _ = machine.requestPartRead(.body(ByteBuffer(string: "abc")))
        case .swallowing:
            _ = plan(&machine, head("/fast/1"))
            _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)
            _ = machine.connectFailed(exchange: 1)
        case .admitting:
            _ = machine.requestPartRead(.head(head("/fast/1")))
            _ = machine.planned(boundPlan("/fast/1"), for: head("/fast/1"))
            _ = machine.admissionStarted(at: .uptimeNanoseconds(0))
            _ = machine.requestPartRead(.end(nil))
        case .connecting, .awaitingHead, .streaming, .paused:
            _ = plan(&machine, head("/fast/1"))
            _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)
            _ = machine.requestPartRead(.end(nil))
            guard phase != .connecting else { break }
            _ = machine.connected(b1, exchange: 1)
            guard phase != .awaitingHead else { break }
            _ = machine.responseHeadReceived(ok)
            guard phase != .streaming else { break }
            _ = machine.writabilityChanged(isWritable: false)
        }
        return machine
    }

    /// The state each phase is described as.
    static func described(_ phase: Phase) -> String {
        switch phase {
        case .idle: "idle"
        case .general: "idle general; owed 1"
        case .collecting: "idle collecting 3/6"
        case .swallowing: "idle swallowing"
        case .admitting: "connecting #1 admitting"
        case .connecting: "connecting #1"
        case .awaitingHead: "awaitingHead #1 on b1"
        case .streaming: "streaming #1 on b1 200"
        case .paused: "streaming #1 on b1 200 paused"
        }
    }

    /// One row of a table: in `phase`, the event returns `action` and leaves `state`
    /// (`nil`: the phase's own state, unchanged).
    struct Row: Sendable, CustomTestStringConvertible {
        let phase: Phase
        let action: String
        let state: String?

        init(_ phase: Phase, _ action: String, _ state: String? = nil) {
            self.phase = phase
            self.action = action
            self.state = state
        }

        var testDescription: String { "\(phase): \(action)" }
    }

    static func check(_ row: Row, _ event: (inout Machine) -> Machine.Action, sourceLocation: SourceLocation = #_sourceLocation) {
        var machine = Self.machine(in: row.phase)
        let action = event(&machine)
        #expect(describe(action) == row.action, sourceLocation: sourceLocation)
        #expect(describe(machine.state) == row.state ?? described(row.phase), sourceLocation: sourceLocation)
    }

    // MARK: Every phase × every event

    @Test func eachPhaseIsReachedAsDescribed() {
        for phase in Phase.allCases {
            #expect(Self.describe(Self.machine(in: phase).state) == Self.described(phase), "\(phase)")
        }
    }

    /// A head is planned only when nothing is owed; during an exchange it waits in the queue.
    @Test(arguments: [
        Row(.idle, "plan /fast/2"),
        Row(.general, "passOn head /fast/2", "idle general; owed 2"),
        // NIO's decoder sends no head before the `.end` of the request before it:
        Row(.collecting, "plan /fast/2", "idle collecting 3/6"),
        Row(.swallowing, "plan /fast/2"),
        Row(.admitting, "none", "connecting #1 admitting; queued 1"),
        Row(.connecting, "none", "connecting #1; queued 1"),
        Row(.awaitingHead, "none", "awaitingHead #1 on b1; queued 1"),
        Row(.streaming, "none", "streaming #1 on b1 200; queued 1"),
        Row(.paused, "none", "streaming #1 on b1 200 paused; queued 1"),
    ])
    func aHeadIsRead(_ row: Row) {
        Self.check(row) { $0.requestPartRead(.head(Self.head("/fast/2"))) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "passOn body x"),
        Row(.collecting, "none", "idle collecting 4/6"),
        Row(.swallowing, "none"),
        Row(.admitting, "none", "connecting #1 admitting; queued 1"),
        Row(.connecting, "none", "connecting #1; queued 1"),
        Row(.awaitingHead, "none", "awaitingHead #1 on b1; queued 1"),
        Row(.streaming, "none", "streaming #1 on b1 200; queued 1"),
        Row(.paused, "none", "streaming #1 on b1 200 paused; queued 1"),
    ])
    func aBodyPartIsRead(_ row: Row) {
        Self.check(row) { $0.requestPartRead(.body(ByteBuffer(string: "x"))) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "passOn end", "idle; owed 1"),
        Row(.collecting, "close", "idle"),  // 3 of the 6 bytes announced
        Row(.swallowing, "none", "idle"),
        Row(.admitting, "none", "connecting #1 admitting; queued 1"),
        Row(.connecting, "none", "connecting #1; queued 1"),
        Row(.awaitingHead, "none", "awaitingHead #1 on b1; queued 1"),
        Row(.streaming, "none", "streaming #1 on b1 200; queued 1"),
        Row(.paused, "none", "streaming #1 on b1 200 paused; queued 1"),
    ])
    func anEndIsRead(_ row: Row) {
        Self.check(row) { $0.requestPartRead(.end(nil)) }
    }

    @Test(arguments: [
        Row(.idle, "giveBack b9"),
        Row(.general, "giveBack b9"),
        Row(.collecting, "giveBack b9"),
        Row(.swallowing, "giveBack b9"),  // exchange #1 was answered already
        Row(.admitting, "giveBack b9"),  // no connection was asked for: the proof is not recorded yet
        Row(.connecting, "send /b/1 on b9", "awaitingHead #1 on b9"),
        Row(.awaitingHead, "giveBack b9"),
        Row(.streaming, "giveBack b9"),
        Row(.paused, "giveBack b9"),
    ])
    func aConnectionArrives(_ row: Row) {
        Self.check(row) { $0.connected(Self.b9, exchange: 1) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "answerProblem 502 #1 502", "idle"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "none"),
        Row(.paused, "none"),
    ])
    func aConnectFails(_ row: Row) {
        Self.check(row) { $0.connectFailed(exchange: 1) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "writeHead 200 rid-/fast/1 timeout 1s", "streaming #1 on b1 200"),
        Row(.streaming, "none"),
        Row(.paused, "none"),
    ])
    func theAnswersHeadArrives(_ row: Row) {
        Self.check(row) { $0.responseHeadReceived(Self.ok) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "writeBody x timeout 1s"),
        Row(.paused, "writeBody x timeout 1s"),
    ])
    func aPartOfTheAnswersBodyArrives(_ row: Row) {
        Self.check(row) { $0.responseBodyReceived(ByteBuffer(string: "x")) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "flush"),
        Row(.paused, "flush"),
    ])
    func theBackendsReadBatchEnds(_ row: Row) {
        Self.check(row) { $0.backendReadCompleted() }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "endAnswer #1 200 on b1 reusable", "idle"),
        Row(.paused, "endAnswer #1 200 on b1 reusable resumeReading", "idle"),
    ])
    func theAnswerEnds(_ row: Row) {
        Self.check(row) { $0.responseEndReceived(reusable: true) }
    }

    /// Before the answer's head, a fresh connection's failure is a 502; after it, the app's
    /// connection cannot be saved.
    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "answerProblem 502 #1 502", "idle"),
        Row(.streaming, "breakOff #1 200", "idle"),
        Row(.paused, "breakOff #1 200", "idle"),
    ])
    func theBackendFails(_ row: Row) {
        Self.check(row) { $0.backendFailed() }
    }

    /// A 504 while nothing of the answer is written; once it has begun, both connections close.
    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "answerProblem 503 #1 503 Retry-After", "idle"),  // the backend was never asked
        Row(.connecting, "answerProblem 504 #1 504", "idle"),
        Row(.awaitingHead, "answerProblem 504 #1 504 closing b1", "idle"),
        Row(.streaming, "breakOff #1 200 closing b1", "idle"),
        Row(.paused, "breakOff #1 200 closing b1", "idle"),
    ])
    func theRoutesTimeoutPasses(_ row: Row) {
        Self.check(row) { $0.timerFired() }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "setBackendReading b1 off", "streaming #1 on b1 200 paused"),
        Row(.paused, "none"),
    ])
    func theAppStopsTakingWrites(_ row: Row) {
        Self.check(row) { $0.writabilityChanged(isWritable: false) }
    }

    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "none"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "none"),
        Row(.paused, "setBackendReading b1 on", "streaming #1 on b1 200"),
    ])
    func theAppTakesWritesAgain(_ row: Row) {
        Self.check(row) { $0.writabilityChanged(isWritable: true) }
    }

    /// Only the exchange waiting for the store starts once its proof is recorded, and only once.
    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "startExchange idleAtMost 30s", "connecting #1"),
        Row(.connecting, "none"),  // admitted already, or never waiting
        Row(.awaitingHead, "none"),
        Row(.streaming, "none"),
        Row(.paused, "none"),
    ])
    func theStoreRecordsTheProof(_ row: Row) {
        Self.check(row) { $0.admitted(exchange: 1) }
    }

    /// A proof used before (or a store that cannot say) answers only the exchange waiting for it.
    @Test(arguments: [
        Row(.idle, "none"),
        Row(.general, "none"),
        Row(.collecting, "none"),
        Row(.swallowing, "none"),
        Row(.admitting, "answerProblem 401 #1 401 WWW-Authenticate", "idle"),
        Row(.connecting, "none"),
        Row(.awaitingHead, "none"),
        Row(.streaming, "none"),
        Row(.paused, "none"),
    ])
    func theStoreRefusesTheProof(_ row: Row) {
        Self.check(row) { $0.refused(.invalidToken("used"), headers: [("WWW-Authenticate", "DPoP")], exchange: 1) }
    }

    /// The handler armed the timer and took an idle connection: only an exchange that may reach
    /// the backend uses it; any other phase gives it back.
    @Test(arguments: [
        Row(.idle, "giveBack b9"),
        Row(.general, "giveBack b9"),
        Row(.collecting, "giveBack b9"),
        Row(.swallowing, "giveBack b9"),
        Row(.admitting, "giveBack b9"),  // not admitted: the backend is not asked
        Row(.connecting, "send /b/1 on b9", "awaitingHead #1 on b9 reused"),
        Row(.awaitingHead, "giveBack b9"),
        Row(.streaming, "giveBack b9"),
        Row(.paused, "giveBack b9"),
    ])
    func anExchangeStartsWithAnIdleConnection(_ row: Row) {
        Self.check(row) { $0.exchangeStarted(at: .uptimeNanoseconds(7), idle: Self.b9) }
    }

    /// The app's connection closes: a body being collected is dropped, a backend connection
    /// in use is closed (it may still answer), the exchange is over.
    @Test(arguments: [
        Row(.idle, "stop"),
        Row(.general, "stop"),
        Row(.collecting, "stop", "idle"),
        Row(.swallowing, "stop"),
        Row(.admitting, "stop", "idle"),
        Row(.connecting, "stop", "idle"),
        Row(.awaitingHead, "stop closing b1", "idle"),
        Row(.streaming, "stop closing b1", "idle"),
        Row(.paused, "stop closing b1", "idle"),
    ])
    func theAppsConnectionCloses(_ row: Row) {
        Self.check(row) { $0.connectionClosed() }
    }

    /// The drain goes on at once unless fast work remains; Hummingbird's own requests never hold it.
    @Test(arguments: [
        Row(.idle, "passQuiesceOn", "idle; drain passed on"),
        Row(.general, "passQuiesceOn", "idle general; owed 1; drain passed on"),
        Row(.collecting, "none", "idle collecting 3/6; drain held"),
        Row(.swallowing, "passQuiesceOn", "idle swallowing; drain passed on"),
        Row(.admitting, "none", "connecting #1 admitting; drain held"),
        Row(.connecting, "none", "connecting #1; drain held"),
        Row(.awaitingHead, "none", "awaitingHead #1 on b1; drain held"),
        Row(.streaming, "none", "streaming #1 on b1 200; drain held"),
        Row(.paused, "none", "streaming #1 on b1 200 paused; drain held"),
    ])
    func theServerDrains(_ row: Row) {
        Self.check(row) { $0.quiesceRequested() }
    }

    /// An answer's end written with no drain held changes nothing.
    @Test(arguments: Phase.allCases)
    func anAnswersEndIsWrittenWithoutADrain(_ phase: Phase) {
        Self.check(Row(phase, "none")) { $0.answerEndWritten() }
    }

    @Test(arguments: Phase.allCases)
    func anEmptyQueueHasNothingToProcess(_ phase: Phase) {
        var machine = Self.machine(in: phase)
        #expect(Self.describe(machine.processNextQueuedPart()) == "nil")
        #expect(Self.describe(machine.state) == Self.described(phase))
    }

    // MARK: A fast exchange from start to end

    @Test func aBodylessFastRequestRunsItsWholeExchange() {
        var machine = Machine(maximumQueuedParts: 256)
        let head = Self.head("/fast/1")
        #expect(Self.describe(machine.requestPartRead(.head(head))) == "plan /fast/1")
        #expect(Self.describe(machine.state) == "idle")
        #expect(Self.describe(machine.planned(Self.plan(head), for: head)) == "startExchange idleAtMost 30s")
        #expect(Self.describe(machine.state) == "connecting #1 swallowsEnd")
        #expect(Self.describe(machine.exchangeStarted(at: .uptimeNanoseconds(42), idle: nil)) == "connect #1")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.state) == "connecting #1")
        #expect(Self.describe(machine.connected(Self.b1, exchange: 1)) == "send /b/1 on b1")
        #expect(Self.describe(machine.responseHeadReceived(Self.ok)) == "writeHead 200 rid-/fast/1 timeout 1s")
        #expect(Self.describe(machine.responseBodyReceived(ByteBuffer(string: "one"))) == "writeBody one timeout 1s")
        #expect(Self.describe(machine.backendReadCompleted()) == "flush")
        let end = machine.responseEndReceived(reusable: true)
        #expect(Self.describe(end) == "endAnswer #1 200 on b1 reusable")
        guard case .endAnswer(let completion, _, _, _) = end else { return }
        #expect(completion.exchange.started == .uptimeNanoseconds(42), "the duration is measured from the handler's clock")
        #expect(Self.describe(machine.state) == "idle")
        do { let batchGoesOn = machine.readBatchEnded(); #expect(!batchGoesOn, "nothing went to Hummingbird") }
    }

    /// An ingress's question answered on the event loop (forward auth): the answer and its end at
    /// once, no backend asked, the question's `.end` dropped, and the next request routed as usual.
    @Test func aDecisionIsAnsweredWithoutABackend() {
        var machine = Machine(maximumQueuedParts: 256)
        let head = Self.head("/forward-auth")
        #expect(Self.describe(machine.requestPartRead(.head(head))) == "plan /forward-auth")
        var plan = try! #require(Self.plan(Self.head("/fast/1")))
        plan.answer = HTTPResponseHead(version: .http1_1, status: .ok, headers: ["X-BPId": "42"])
        #expect(Self.describe(machine.planned(plan, for: head)) == "answer 200 #1 200")
        #expect(Self.describe(machine.state) == "idle swallowing")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.state) == "idle")
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/2")))) == "plan /fast/2")
        do { let batchGoesOn = machine.readBatchEnded(); #expect(!batchGoesOn, "nothing went to Hummingbird") }
    }

    /// Questions pipelined behind a running exchange wait in its queue, and are answered in order.
    @Test func aDecisionQueuedBehindAnExchangeWaitsForIt() {
        var machine = Self.machine(in: .awaitingHead)
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/forward-auth")))) == "none")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        _ = machine.responseHeadReceived(Self.ok)
        let end = machine.responseEndReceived(reusable: true)
        #expect(Self.describe(end) == "endAnswer #1 200 on b1 reusable processesQueue")
        #expect(Self.describe(machine.processNextQueuedPart()) == "plan /forward-auth")
    }

    @Test func anIdleConnectionIsTakenAtOnce() {
        var machine = Machine(maximumQueuedParts: 256)
        _ = Self.plan(&machine, Self.head("/fast/1"))
        #expect(Self.describe(machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: Self.b1)) == "send /b/1 on b1")
        #expect(Self.describe(machine.state) == "awaitingHead #1 on b1 reused swallowsEnd")
    }

    /// A request that is never sent twice takes only a connection used moments ago.
    @Test(arguments: [(HTTPMethod.GET, "30s"), (.HEAD, "30s"), (.PUT, "30s"), (.DELETE, "30s"), (.POST, "1s"), (.PATCH, "1s")])
    func onlyIdempotentRequestsTakeLongIdleConnections(method: HTTPMethod, idleAtMost: String) {
        var machine = Machine(maximumQueuedParts: 256)
        #expect(Self.describe(Self.plan(&machine, Self.head("/fast/1", method))) == "startExchange idleAtMost \(idleAtMost)")
    }

    @Test func theAnswersConnectionIsClosedWhenItCannotBeReused() {
        var machine = Self.machine(in: .streaming)
        #expect(Self.describe(machine.responseEndReceived(reusable: false)) == "endAnswer #1 200 on b1")
    }

    // MARK: Request bodies

    @Test func aBodyIsCollectedWholeBeforeTheBackendIsAsked() {
        var machine = Machine(maximumQueuedParts: 256)
        #expect(Self.describe(Self.plan(&machine, Self.head("/fast/p", .POST, length: 6))) == "none")
        #expect(Self.describe(machine.state) == "idle collecting 0/6")
        #expect(Self.describe(machine.requestPartRead(.body(ByteBuffer(string: "abc")))) == "none")
        #expect(Self.describe(machine.requestPartRead(.body(ByteBuffer(string: "def")))) == "none")
        #expect(Self.describe(machine.state) == "idle collecting 6/6")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "startExchange idleAtMost 1s")
        #expect(Self.describe(machine.state) == "connecting #1", "the end was read: nothing to swallow")
        #expect(Self.describe(machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)) == "connect #1")
        #expect(Self.describe(machine.connected(Self.b1, exchange: 1)) == "send /b/p body abcdef on b1")
    }

    @Test func aBodyInOnePartIsSentWithoutACopy() {
        var machine = Machine(maximumQueuedParts: 256)
        _ = Self.plan(&machine, Self.head("/fast/p", .PUT, length: 6))
        let bytes = ByteBuffer(string: "abcdef")
        _ = machine.requestPartRead(.body(bytes))
        _ = machine.requestPartRead(.end(nil))
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)
        guard case .send(_, let body?, _) = machine.connected(Self.b1, exchange: 1) else {
            Issue.record("no body sent")
            return
        }
        #expect(body.withUnsafeReadableBytes { $0.baseAddress } == bytes.withUnsafeReadableBytes { $0.baseAddress })
    }

    /// NIO's decoder frames a body by its `Content-Length`; a body of another length would make
    /// the backend read the next request as body, so it closes the connection.
    @Test func aBodyLongerThanAnnouncedClosesTheConnection() {
        var machine = Self.machine(in: .collecting)
        #expect(Self.describe(machine.requestPartRead(.body(ByteBuffer(string: "defg")))) == "close")
        #expect(Self.describe(machine.state) == "idle")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none", "a broken body never reaches a backend")
    }

    @Test func anAnnouncedBodyThatNeverCameClosesTheConnection() {
        var machine = Machine(maximumQueuedParts: 256)
        _ = Self.plan(&machine, Self.head("/fast/p", .POST, length: 6))
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "close")
        #expect(Self.describe(machine.state) == "idle")
    }

    @Test func aClientLeavingMidBodyLeavesNothingToSend() {
        var machine = Self.machine(in: .collecting)
        _ = machine.connectionClosed()
        #expect(Self.describe(machine.requestPartRead(.body(ByteBuffer(string: "def")))) == "none")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.state) == "idle")
    }

    // MARK: Hummingbird's requests

    @Test func aDeclinedRequestGoesToHummingbirdWithAllItsParts() {
        var machine = Machine(maximumQueuedParts: 256)
        let head = Self.head("/general", .POST, length: 1)
        #expect(Self.describe(machine.requestPartRead(.head(head))) == "plan /general")
        #expect(Self.describe(machine.planned(nil, for: head)) == "passOn head /general")
        #expect(Self.describe(machine.requestPartRead(.body(ByteBuffer(string: "x")))) == "passOn body x")
        #expect(Self.describe(machine.requestPartRead(.end(["Trailer": "t"]))) == "passOn end Trailer: t")
        #expect(Self.describe(machine.state) == "idle; owed 1")
        do { let batchGoesOn = machine.readBatchEnded(); #expect(batchGoesOn, "the end of the batch goes on to Hummingbird") }
        do { let batchGoesOn = machine.readBatchEnded(); #expect(!batchGoesOn, "and only once") }
    }

    /// A fast request never overtakes an answer Hummingbird owes.
    @Test func whileHummingbirdOwesAnAnswerRequestsGoToIt() {
        var machine = Self.machine(in: .general)
        _ = machine.requestPartRead(.end(nil))
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/2")))) == "passOn head /fast/2")
        _ = machine.requestPartRead(.end(nil))
        #expect(Self.describe(machine.state) == "idle; owed 2")
        machine.generalAnswerEnded()
        machine.generalAnswerEnded()
        #expect(Self.describe(machine.state) == "idle")
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/3")))) == "plan /fast/3")
    }

    // MARK: Pipelining: the queue

    @Test func partsReadDuringAnExchangeAreRoutedInOrderOnceItIsAnswered() {
        var machine = Self.machine(in: .connecting)
        for part in Self.request("/general") + Self.request("/fast/2") {
            #expect(Self.describe(machine.requestPartRead(part)) == "none")
        }
        #expect(Self.describe(machine.state) == "connecting #1; queued 4")
        #expect(Self.describe(machine.processNextQueuedPart()) == "nil", "an exchange runs")
        #expect(Self.describe(machine.timerFired()) == "answerProblem 504 #1 504 processesQueue")
        #expect(Self.describe(machine.processNextQueuedPart()) == "plan /general")
        #expect(Self.describe(machine.planned(nil, for: Self.head("/general"))) == "passOn head /general")
        #expect(Self.describe(machine.processNextQueuedPart()) == "passOn end")
        // Hummingbird now owes /general: /fast/2 goes to it too rather than overtaking.
        #expect(Self.describe(machine.processNextQueuedPart()) == "passOn head /fast/2")
        #expect(Self.describe(machine.processNextQueuedPart()) == "passOn end")
        #expect(Self.describe(machine.processNextQueuedPart()) == "nil")
        #expect(Self.describe(machine.state) == "idle; owed 2")
        do { let batchGoesOn = machine.readBatchEnded(); #expect(batchGoesOn) }
    }

    /// A fast request from the queue stops the queue until it is answered; its `.end` is still
    /// queued, so a part arriving meanwhile is queued behind it, never swallowed in its place.
    @Test func aFastRequestFromTheQueueRunsBeforeTheRest() {
        var machine = Self.machine(in: .connecting)
        for part in Self.request("/fast/2") + Self.request("/fast/3") { _ = machine.requestPartRead(part) }
        _ = machine.connected(Self.b1, exchange: 1)
        _ = machine.responseHeadReceived(Self.ok)
        #expect(Self.describe(machine.responseEndReceived(reusable: true)) == "endAnswer #1 200 on b1 reusable processesQueue")
        #expect(Self.describe(machine.processNextQueuedPart()) == "plan /fast/2")
        let fast2 = Self.head("/fast/2")
        #expect(Self.describe(machine.planned(Self.plan(fast2), for: fast2)) == "startExchange idleAtMost 30s")
        #expect(Self.describe(machine.processNextQueuedPart()) == "nil")
        #expect(Self.describe(machine.state) == "connecting #2 swallowsEnd; queued 3")
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/4")))) == "none")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.state) == "connecting #2 swallowsEnd; queued 5", "/fast/4's end was taken for /fast/2's")
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: Self.b1)
        _ = machine.responseHeadReceived(Self.ok)
        #expect(Self.describe(machine.responseEndReceived(reusable: true)) == "endAnswer #2 200 on b1 reusable processesQueue")
        #expect(Self.describe(machine.state) == "idle swallowing; queued 5")
        #expect(Self.describe(machine.processNextQueuedPart()) == "none", "/fast/2's own end, dropped")
        #expect(Self.describe(machine.processNextQueuedPart()) == "plan /fast/3")
    }

    @Test func theFastRequestsEndIsSwallowedOnce() {
        var machine = Machine(maximumQueuedParts: 256)
        _ = Self.plan(&machine, Self.head("/fast/1"))
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.state) == "connecting #1; queued 1")
    }

    @Test func tooManyQueuedPartsCloseTheConnection() {
        var machine = Self.machine(in: .connecting, maximumQueuedParts: 2)
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/2")))) == "none")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.requestPartRead(.head(Self.head("/fast/3")))) == "close")
        #expect(Self.describe(machine.state) == "connecting #1; queued 2")
    }

    // MARK: Connections: late, failed, replaced

    /// A connection that arrives after its exchange was answered 504 is given back and never
    /// answers a later request.
    @Test func aLateConnectionNeverTouchesALaterExchange() {
        var machine = Self.machine(in: .connecting)
        _ = machine.timerFired()
        _ = Self.plan(&machine, Self.head("/fast/2"))
        #expect(Self.describe(machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)) == "connect #2")
        #expect(Self.describe(machine.connectFailed(exchange: 1)) == "none")
        #expect(Self.describe(machine.connected(Self.b1, exchange: 1)) == "giveBack b1")
        #expect(Self.describe(machine.state) == "connecting #2 swallowsEnd")
        #expect(Self.describe(machine.connected(Self.b2, exchange: 2)) == "send /b/2 on b2")
    }

    /// A pooled connection the backend had closed: an idempotent request is sent again once,
    /// on a fresh connection; any other is answered 502 and never sent twice.
    @Test(arguments: [(HTTPMethod.GET, true), (.HEAD, true), (.PUT, true), (.DELETE, true), (.OPTIONS, true),
                      (.POST, false), (.PATCH, false)])
    func aFailedPooledConnectionIsReplacedOnlyForIdempotentRequests(method: HTTPMethod, replaced: Bool) {
        var machine = Machine(maximumQueuedParts: 256)
        _ = Self.plan(&machine, Self.head("/fast/r", method))
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: Self.b1)
        guard replaced else {
            #expect(Self.describe(machine.backendFailed()) == "answerProblem 502 #1 502")
            return
        }
        #expect(Self.describe(machine.backendFailed()) == "connect #1")
        #expect(Self.describe(machine.state) == "connecting #1 retried swallowsEnd")
        #expect(Self.describe(machine.connected(Self.b2, exchange: 1)) == "send /b/r on b2")
        #expect(Self.describe(machine.backendFailed()) == "answerProblem 502 #1 502", "sent again only once")
    }

    // MARK: Backpressure

    /// The backend is read only as fast as the app takes the answer, with one option change per turn.
    @Test func theBackendIsReadOnlyAsFastAsTheAppTakesTheAnswer() {
        var machine = Self.machine(in: .streaming)
        #expect(Self.describe(machine.writabilityChanged(isWritable: false)) == "setBackendReading b1 off")
        #expect(Self.describe(machine.responseBodyReceived(ByteBuffer(string: "x"))) == "writeBody x timeout 1s")
        #expect(Self.describe(machine.writabilityChanged(isWritable: false)) == "none")
        #expect(Self.describe(machine.writabilityChanged(isWritable: true)) == "setBackendReading b1 on")
        #expect(Self.describe(machine.writabilityChanged(isWritable: true)) == "none")
        #expect(Self.describe(machine.writabilityChanged(isWritable: false)) == "setBackendReading b1 off")
        #expect(Self.describe(machine.responseEndReceived(reusable: true)) == "endAnswer #1 200 on b1 reusable resumeReading",
                "a pooled connection is given back reading")
    }

    // MARK: The server's drain

    @Test func withNothingFastTheDrainGoesOnOnce() {
        var machine = Machine(maximumQueuedParts: 256)
        #expect(Self.describe(machine.quiesceRequested()) == "passQuiesceOn")
        #expect(Self.describe(machine.quiesceRequested()) == "none")
        #expect(Self.describe(machine.answerEndWritten()) == "none")
        #expect(Self.describe(Self.plan(&machine, Self.head("/fast/1"))) == "passOn head /fast/1", "after the drain, Hummingbird answers")
    }

    @Test func aHeldDrainGoesOnOnceTheAnswersEndIsWritten() {
        var machine = Self.machine(in: .streaming)
        _ = machine.quiesceRequested()
        #expect(Self.describe(machine.quiesceRequested()) == "none")
        #expect(Self.describe(machine.responseEndReceived(reusable: true)) == "endAnswer #1 200 on b1 reusable reportsEndWritten")
        #expect(Self.describe(machine.state) == "idle; drain held")
        #expect(Self.describe(machine.answerEndWritten()) == "passQuiesceOn")
        #expect(Self.describe(machine.state) == "idle; drain passed on")
        #expect(Self.describe(machine.answerEndWritten()) == "none")
    }

    /// Requests queued while the drain is held are served the fast way before it goes on.
    @Test func aHeldDrainWaitsForTheQueuedRequests() {
        var machine = Self.machine(in: .connecting)
        for part in Self.request("/fast/2") { _ = machine.requestPartRead(part) }
        _ = machine.quiesceRequested()
        #expect(Self.describe(machine.connectFailed(exchange: 1)) == "answerProblem 502 #1 502 reportsEndWritten processesQueue")
        #expect(Self.describe(machine.answerEndWritten()) == "none", "/fast/2 is still queued")
        #expect(Self.describe(machine.processNextQueuedPart()) == "plan /fast/2", "a held drain does not turn requests away")
        _ = machine.planned(Self.plan(Self.head("/fast/2")), for: Self.head("/fast/2"))
        #expect(Self.describe(machine.answerEndWritten()) == "none", "/fast/2 is being relayed")
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: Self.b1)
        _ = machine.responseHeadReceived(Self.ok)
        #expect(Self.describe(machine.responseEndReceived(reusable: true))
                == "endAnswer #2 200 on b1 reusable reportsEndWritten processesQueue")
        #expect(Self.describe(machine.processNextQueuedPart()) == "none")
        #expect(Self.describe(machine.answerEndWritten()) == "passQuiesceOn")
    }

    @Test func aDrainHeldWhileABodyArrivesWaitsForItsAnswer() {
        var machine = Self.machine(in: .collecting)
        _ = machine.quiesceRequested()
        _ = machine.requestPartRead(.body(ByteBuffer(string: "def")))
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "startExchange idleAtMost 1s")
        #expect(Self.describe(machine.answerEndWritten()) == "none")
        _ = machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: nil)
        #expect(Self.describe(machine.timerFired()) == "answerProblem 504 #1 504 reportsEndWritten")
        #expect(Self.describe(machine.answerEndWritten()) == "passQuiesceOn")
    }

    // MARK: A DPoP proof's first use, written to the store before the exchange

    /// A store the machine never reaches: the handler writes the proof, the machine only waits.
    struct UnusedStore: SingleUseStore {
        func insertOnce(kind: String, keyHash: String, value: Data, expiresAt: Date, now: Date) async throws -> Bool { true }
        func consumeOnce(kind: String, keyHash: String, now: Date) async throws -> Data? { nil }
    }

    static let dpopConfiguration = GatehouseConfiguration(server: ServerSettings(publicBaseURL: "https://gatehouse.example.com"),
                                                          store: StoreSettings(sqlitePath: ":memory:"), upstreams: [:], clients: [:])
    static let dpop = DPoPEnforcement(
        configuration: dpopConfiguration,
        state: DPoPEnforcement.State(configuration: dpopConfiguration, store: UnusedStore(), now: Date.init), now: Date.init)

    /// A plan whose proof is new to this instance: the exchange waits for the store.
    static func boundPlan(_ uri: String) -> FastRelayPlan {
        var plan = plan(head(uri))!
        plan.proofRecord = FastProofRecord(spend: DPoPEnforcement.ProofSpend(keyHash: "jti-hash", expiresAt: .distantFuture),
                                           dpop: Self.dpop)
        return plan
    }

    @Test func aBoundRequestStartsOnlyOnceTheStoreHasItsProof() {
        var machine = Machine(maximumQueuedParts: 8)
        _ = machine.requestPartRead(.head(Self.head("/fast/1")))
        // Without a body it starts on its head; the end is dropped when it comes.
        #expect(Self.describe(machine.planned(Self.boundPlan("/fast/1"), for: Self.head("/fast/1"))) == "admit jti-hash #1")
        #expect(Self.describe(machine.requestPartRead(.end(nil))) == "none")
        #expect(Self.describe(machine.admitted(exchange: 2)) == "none", "another exchange's admission")
        #expect(Self.describe(machine.admitted(exchange: 1)) == "startExchange idleAtMost 30s")
        #expect(Self.describe(machine.exchangeStarted(at: .uptimeNanoseconds(0), idle: Self.b1)) == "send /b/1 on b1")
    }

    @Test func aBoundRequestWhoseProofTheStoreRefusesIsAnsweredWithTheHeaders() {
        var machine = Machine(maximumQueuedParts: 8)
        _ = machine.requestPartRead(.head(Self.head("/fast/1")))
        _ = machine.planned(Self.boundPlan("/fast/1"), for: Self.head("/fast/1"))
        _ = machine.requestPartRead(.end(nil))
        #expect(Self.describe(machine.refused(.invalidToken("used"), headers: [("WWW-Authenticate", "DPoP"), ("DPoP-Nonce", "n")], exchange: 1))
                == "answerProblem 401 #1 401 WWW-Authenticate DPoP-Nonce")
        #expect(Self.describe(machine.admitted(exchange: 1)) == "none", "answered: a late admission starts nothing")
        #expect(Self.describe(machine.state) == "idle")
    }

    @Test func anAdmissionThatArrivesAfterTheConnectionClosedStartsNothing() {
        var machine = Machine(maximumQueuedParts: 8)
        _ = machine.requestPartRead(.head(Self.head("/fast/1")))
        _ = machine.planned(Self.boundPlan("/fast/1"), for: Self.head("/fast/1"))
        _ = machine.requestPartRead(.end(nil))
        #expect(Self.describe(machine.connectionClosed()) == "stop")
        #expect(Self.describe(machine.admitted(exchange: 1)) == "none")
        #expect(Self.describe(machine.refused(.identityUnavailable(), headers: [], exchange: 1)) == "none")
    }

    @Test func aStoreThatDoesNotAnswerInTimeIsTheRoutesTimeout() {
        var machine = Machine(maximumQueuedParts: 8)
        _ = machine.requestPartRead(.head(Self.head("/fast/1")))
        _ = machine.planned(Self.boundPlan("/fast/1"), for: Self.head("/fast/1"))
        _ = machine.requestPartRead(.end(nil))
        #expect(Self.describe(machine.timerFired()) == "answerProblem 503 #1 503 Retry-After", "the backend was never asked")
        #expect(Self.describe(machine.admitted(exchange: 1)) == "none")
    }

    // MARK: Helpers

    static func head(_ uri: String, _ method: HTTPMethod = .GET, length: Int = 0) -> HTTPRequestHead {
        var headers: HTTPHeaders = ["Host": "g"]
        if length > 0 { headers.add(name: "Content-Length", value: String(length)) }
        return HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
    }

    static func request(_ uri: String) -> [HTTPServerRequestPart] {
        [.head(head(uri)), .end(nil)]
    }

    /// The test planner's plan: `/fast/…` goes the fast way, to `/b/…`, with a 1 s timeout.
    static func plan(_ head: HTTPRequestHead) -> FastRelayPlan? {
        FastRelayHandlerTests.Planner().plan(head, remoteAddress: nil)
    }

    /// Reads `head` and answers the `.plan` it asks for with the test planner's plan.
    static func plan(_ machine: inout Machine, _ head: HTTPRequestHead) -> Machine.Action {
        let action = machine.requestPartRead(.head(head))
        guard case .plan(let asked) = action else { return action }
        return machine.planned(plan(asked), for: asked)
    }

    static func describe(_ action: Machine.Action?) -> String {
        guard let action else { return "nil" }
        switch action {
        case .none: return "none"
        case .passOn(.head(let head)): return "passOn head \(head.uri)"
        case .passOn(.body(let body)): return "passOn body \(String(buffer: body))"
        case .passOn(.end(let trailers)): return "passOn end" + (trailers.map { $0.map { " \($0.name): \($0.value)" }.joined() } ?? "")
        case .plan(let head): return "plan \(head.uri)"
        case .admit(let proof, _, let exchange): return "admit \(proof.spend.keyHash) #\(exchange)"
        case .startExchange(_, let idleAtMost): return "startExchange idleAtMost \(seconds(idleAtMost))"
        case .connect(_, let exchange): return "connect #\(exchange)"
        case .send(let head, let body, let backend):
            return "send \(head.uri)" + (body.map { " body \(String(buffer: $0))" } ?? "") + " on \(backend)"
        case .giveBack(let backend): return "giveBack \(backend)"
        case .writeHead(let head, let requestID, let timeout):
            return "writeHead \(head.status.code) \(requestID) timeout \(seconds(timeout))"
        case .writeBody(let body, let timeout): return "writeBody \(String(buffer: body)) timeout \(seconds(timeout))"
        case .flush: return "flush"
        case .setBackendReading(let backend, let reading): return "setBackendReading \(backend) \(reading ? "on" : "off")"
        case .endAnswer(let completion, let backend, let reusable, let resumeReading):
            return "endAnswer \(describe(completion)) on \(backend)" + (reusable ? " reusable" : "")
                + (resumeReading ? " resumeReading" : "") + flags(completion)
        case .answer(let head, let completion):
            return "answer \(head.status.code) \(describe(completion))" + flags(completion)
        case .answerProblem(let problem, let completion, let closing, let headers):
            return "answerProblem \(problem.status) \(describe(completion))" + (closing.map { " closing \($0)" } ?? "") + flags(completion)
                + headers.map { " \($0.0)" }.joined()
        case .breakOff(let exchange, let status, let closing):
            return "breakOff #\(exchange.id) \(status)" + (closing.map { " closing \($0)" } ?? "")
        case .close: return "close"
        case .passQuiesceOn: return "passQuiesceOn"
        case .stop(let closing): return "stop" + (closing.map { " closing \($0)" } ?? "")
        }
    }

    static func describe(_ completion: Machine.Completion) -> String {
        "#\(completion.exchange.id) \(completion.status)"
    }

    static func flags(_ completion: Machine.Completion) -> String {
        (completion.reportsEndWritten ? " reportsEndWritten" : "") + (completion.processesQueue ? " processesQueue" : "")
    }

    static func describe(_ state: Machine.State) -> String {
        func flags(_ exchange: Machine.Exchange) -> String {
            (exchange.admitting ? " admitting" : "") + (exchange.reused ? " reused" : "") + (exchange.retried ? " retried" : "")
                + (exchange.swallowsEnd ? " swallowsEnd" : "")
        }
        let phase: String
        let app: Machine.AppConnection
        switch state {
        case .idle(let inbound, let connection):
            app = connection
            switch inbound {
            case .idle: phase = "idle"
            case .general: phase = "idle general"
            case .swallowing: phase = "idle swallowing"
            case .collecting(let plan, let body): phase = "idle collecting \(body?.readableBytes ?? 0)/\(plan.bodyLength)"
            }
        case .connecting(let exchange, let connection):
            (phase, app) = ("connecting #\(exchange.id)" + flags(exchange), connection)
        case .awaitingHead(let exchange, let backend, let connection):
            (phase, app) = ("awaitingHead #\(exchange.id) on \(backend)" + flags(exchange), connection)
        case .streaming(let exchange, let backend, let status, let paused, let connection):
            (phase, app) = ("streaming #\(exchange.id) on \(backend) \(status)" + (paused ? " paused" : "") + flags(exchange), connection)
        case .modifying:
            return "modifying"
        }
        var parts = [phase]
        if app.generalOutstanding != 0 { parts.append("owed \(app.generalOutstanding)") }
        if !app.queued.isEmpty { parts.append("queued \(app.queued.count)") }
        switch app.quiesce {
        case .none: break
        case .held: parts.append("drain held")
        case .passedOn: parts.append("drain passed on")
        }
        return parts.joined(separator: "; ")
    }

    static func seconds(_ amount: TimeAmount) -> String {
        "\(amount.nanoseconds / 1_000_000_000)s"
    }
}
