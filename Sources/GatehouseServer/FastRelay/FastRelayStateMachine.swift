import GatehouseCore
import NIOCore
import NIOHTTP1

/// The fast path of one client connection, as a pure value: where each request part goes (on
/// to Hummingbird, into a fast request's body, into the queue behind a running exchange), the
/// exchange with the backend, backpressure, and the server's drain. `FastRelayHandler` carries
/// out what it decides. `Backend` is a backend connection, only held and handed back
/// (`BackendConnection` in the handler, a plain value in tests).
struct FastRelayStateMachine<Backend> {
    enum State {
        /// No fast exchange runs: parts are routed as they arrive.
        case idle(Inbound, AppConnection)
        /// Waiting for a backend connection.
        case connecting(Exchange, AppConnection)
        /// The request is sent; waiting for the answer's head.
        case awaitingHead(Exchange, Backend, AppConnection)
        /// The answer's head went to the app; its body is being relayed. `backendPaused`: reading
        /// the backend is off, because the app takes the answer slower than the backend sends it.
        case streaming(Exchange, Backend, status: UInt, backendPaused: Bool, AppConnection)
        /// Only within a method, while a payload changes in place: its buffers are then
        /// referenced once, and grow without being copied.
        case modifying
    }

    /// Where the parts of the request now arriving go, between exchanges.
    enum Inbound {
        /// Between requests.
        case idle
        /// A request of Hummingbird's: its parts go on.
        case general
        /// The fast request's remaining part (its `.end`): read and dropped.
        case swallowing
        /// A fast request's body: collected until its `.end`, then the exchange starts.
        /// `body` is `nil` until its first bytes arrive, so an announced body holds nothing.
        case collecting(FastRelayPlan, body: ByteBuffer?)

        var isGeneral: Bool {
            if case .general = self { true } else { false }
        }
    }

    /// The server's request to drain the connection (`ChannelShouldQuiesceEvent`).
    enum Quiesce: Equatable {
        /// None yet.
        case none
        /// Received while fast work remained; passed on when none does.
        case held
        /// Passed on to Hummingbird, which closes the connection once its own answers are out.
        case passedOn
    }

    /// What the app's connection keeps whatever the phase.
    struct AppConnection {
        var quiesce = Quiesce.none
        /// Requests handed to Hummingbird whose answer has not ended yet.
        var generalOutstanding = 0
        /// Parts read while an exchange runs, routed in order once it is over.
        var queued = CircularBuffer<HTTPServerRequestPart>()
        /// A part went on to Hummingbird since the last end of a read batch.
        var passedOnInBatch = false
        var lastExchangeID = 0
    }

    /// One fast exchange. `id` tells a late connection (one that arrived after its exchange was
    /// answered 504) from the current exchange's: such a connection never touches the current one.
    struct Exchange {
        let plan: FastRelayPlan
        /// The request's body (`nil` without one), kept to be sent again on a fresh connection.
        let body: ByteBuffer?
        let id: Int
        /// Set by `exchangeStarted(at:idle:)`: the handler reads the clock, not the machine.
        fileprivate(set) var started = NIODeadline.distantPast
        /// The connection came from the idle pool (the backend may have closed it meanwhile).
        fileprivate(set) var reused = false
        /// A failed reused connection was already replaced once.
        fileprivate(set) var retried = false
        /// Waiting for the store to record its DPoP proof (`admit`): the backend is not asked yet.
        fileprivate(set) var admitting = false
        /// The request's `.end` is still to come from the network, to be dropped.
        fileprivate(set) var swallowsEnd: Bool
    }

    /// An answered exchange, for the handler to count and log before it moves on.
    struct Completion {
        let exchange: Exchange
        let status: UInt
        /// A drain is held: write the answer's end with a promise, and report
        /// `answerEndWritten()` once it is written (a close before would drop its last bytes).
        let reportsEndWritten: Bool
        /// Parts wait in the queue: route them (`processNextQueuedPart()`) once this one is counted.
        let processesQueue: Bool
    }

    enum Action {
        case none
        /// Hand this part to Hummingbird.
        case passOn(HTTPServerRequestPart)
        /// Ask the planner about this head, and report its answer with `planned(_:for:)`.
        case plan(HTTPRequestHead)
        /// Arm the route's timer, report the time (`admissionStarted(at:)`) and write the first use of the request's DPoP proof to the store;
        /// report with `admitted(exchange:)` or `refused(_:headers:exchange:)`.
        case admit(FastProofRecord, FastRoute, exchange: Int)
        /// Arm the route's timer, take an idle backend connection used at most `idleAtMost` ago
        /// if the pool has one, and report with `exchangeStarted(at:idle:)`.
        case startExchange(FastRoute, idleAtMost: TimeAmount)
        /// Ask the pool for a new connection for exchange `exchange`; report with
        /// `connected(_:exchange:)` or `connectFailed(exchange:)`.
        case connect(FastRoute, exchange: Int)
        /// Send the request; the answer comes back as the `response…Received` events.
        case send(HTTPRequestHead, body: ByteBuffer?, on: Backend)
        /// A connection no exchange waits for any more: back to the pool, untouched.
        case giveBack(Backend)
        /// Arm the timer again (from now on it bounds the silence between two parts of the
        /// answer) and write the answer's head, as relayed for `requestID`. `writeBody` likewise.
        case writeHead(HTTPResponseHead, requestID: String, timeout: TimeAmount)
        case writeBody(ByteBuffer, timeout: TimeAmount)
        case flush
        /// Turn reading the backend connection on or off.
        case setBackendReading(Backend, Bool)
        /// Disarm the timer and write the answer's end; turn reading the backend back on when
        /// `resumeReading`; give the connection back (`reusable`) or close it; then count.
        case endAnswer(Completion, backend: Backend, reusable: Bool, resumeReading: Bool)
        /// Write this answer (head only: it has no body) and its end; then count. No backend was asked.
        case answer(HTTPResponseHead, Completion)
        /// Close `closing` if set, disarm the timer, answer the problem in full (with `headers`
        /// besides its own); then count.
        case answerProblem(GatehouseProblem, Completion, closing: Backend?, headers: [(String, String)])
        /// The answer has begun and cannot be completed: close `closing` if set, disarm the
        /// timer, count the exchange, and close the app's connection.
        case breakOff(Exchange, status: UInt, closing: Backend?)
        /// Close the app's connection.
        case close
        /// Hand the drain on to Hummingbird.
        case passQuiesceOn
        /// The app's connection is gone: stop the timer, and close `closing` if set.
        case stop(closing: Backend?)
    }

    /// Parts a pipelining client may send while a fast exchange runs; more closes the connection.
    let maximumQueuedParts: Int
    private(set) var state: State = .idle(.idle, AppConnection())

    init(maximumQueuedParts: Int) {
        self.maximumQueuedParts = maximumQueuedParts
    }

    // MARK: The app's requests

    /// A part of the app's request was read.
    mutating func requestPartRead(_ part: HTTPServerRequestPart) -> Action {
        if case .idle = state { return route(part) }
        let limit = maximumQueuedParts
        return withExchange { exchange, app in
            // Parts still queued come first: an exchange started from the queue has its own
            // `.end` in there, and this part belongs to a later request.
            if exchange.swallowsEnd, app.queued.isEmpty {
                if case .end = part { exchange.swallowsEnd = false }
                return .none
            }
            guard app.queued.count < limit else { return .close }
            app.queued.append(part)
            return .none
        } ?? .none
    }

    /// The planner's answer about `head`, asked for with `.plan`: `nil` sends the request the general way.
    mutating func planned(_ plan: FastRelayPlan?, for head: HTTPRequestHead) -> Action {
        guard case .idle(_, let app) = state else { return .none }
        guard let plan else { return handToHummingbird(head, app: app) }
        guard plan.bodyLength > 0 else { return start(plan, body: nil, swallowsEnd: true, app: app) }
        state = .idle(.collecting(plan, body: nil), app)
        return .none
    }

    /// The part, with no exchange running.
    private mutating func route(_ part: HTTPServerRequestPart) -> Action {
        switch part {
        case .head(let head): routeHead(head)
        case .body(let bytes): routeBody(bytes)
        case .end(let trailers): routeEnd(trailers)
        }
    }

    private mutating func routeHead(_ head: HTTPRequestHead) -> Action {
        switch state {
        // Once the drain has gone on to Hummingbird, new requests go to it too (it answers them
        // with `Connection: close`); the fast path would keep a pipelining client's connection
        // open to the deadline. Requests queued while the drain is held are still served here.
        case .idle(let inbound, let app) where !inbound.isGeneral && app.generalOutstanding == 0 && app.quiesce != .passedOn:
            return .plan(head)
        case .idle(_, let app):
            return handToHummingbird(head, app: app)
        case .connecting, .awaitingHead, .streaming, .modifying:
            return .none
        }
    }

    private mutating func handToHummingbird(_ head: HTTPRequestHead, app: AppConnection) -> Action {
        var app = app
        app.generalOutstanding += 1
        app.passedOnInBatch = true
        state = .idle(.general, app)
        return .passOn(.head(head))
    }

    private mutating func routeBody(_ bytes: ByteBuffer) -> Action {
        switch state {
        case .idle(.general, var app):
            app.passedOnInBatch = true
            state = .idle(.general, app)
            return .passOn(.body(bytes))
        case .idle(.collecting(let plan, var body), let app):
            state = .modifying
            guard (body?.readableBytes ?? 0) + bytes.readableBytes <= plan.bodyLength else {
                // NIO's decoder frames the body by its Content-Length: this cannot happen.
                state = .idle(.idle, app)
                return .close
            }
            if body == nil, bytes.readableBytes == plan.bodyLength {
                body = bytes  // the whole body in one part (the common case): no copy
            } else {
                // Grown as bytes arrive: a client announcing 64 KiB and sending nothing holds
                // nothing. The server's channels use NIO's default allocator.
                var grown = body ?? ByteBufferAllocator().buffer(capacity: min(plan.bodyLength, max(4096, 2 * bytes.readableBytes)))
                body = nil  // one reference while it grows: no copy
                var bytes = bytes
                grown.writeBuffer(&bytes)
                body = grown
            }
            state = .idle(.collecting(plan, body: body), app)
            return .none
        case .idle, .connecting, .awaitingHead, .streaming, .modifying:
            return .none
        }
    }

    private mutating func routeEnd(_ trailers: HTTPHeaders?) -> Action {
        switch state {
        case .idle(.general, var app):
            app.passedOnInBatch = true
            state = .idle(.idle, app)
            return .passOn(.end(trailers))
        case .idle(.collecting(let plan, let body), let app):
            // Exactly the announced length, or the backend would read the next request as body.
            guard let body, body.readableBytes == plan.bodyLength else {
                state = .idle(.idle, app)
                return .close
            }
            return start(plan, body: body, swallowsEnd: false, app: app)
        case .idle(_, let app):
            state = .idle(.idle, app)
            return .none
        case .connecting, .awaitingHead, .streaming, .modifying:
            return .none
        }
    }

    private mutating func start(_ plan: FastRelayPlan, body: ByteBuffer?, swallowsEnd: Bool, app: AppConnection) -> Action {
        var app = app
        app.lastExchangeID &+= 1
        var exchange = Exchange(plan: plan, body: body, id: app.lastExchangeID, swallowsEnd: swallowsEnd)
        if let answer = plan.answer {
            // An ingress's question answered here: no backend, over at once.
            return .answer(answer, complete(exchange, status: answer.status.code, app: app))
        }
        exchange.admitting = plan.proofRecord != nil
        state = .connecting(exchange, app)
        if let proof = plan.proofRecord { return .admit(proof, plan.target, exchange: app.lastExchangeID) }
        return startExchange(plan)
    }

    /// The exchange waiting for its admission began at `now` (its duration counts the wait).
    mutating func admissionStarted(at now: NIODeadline) {
        guard case .connecting(var exchange, let app) = state else { return }
        state = .modifying
        exchange.started = now
        state = .connecting(exchange, app)
    }

    /// The store has the first use of exchange `id`'s proof: the exchange may start (once).
    mutating func admitted(exchange id: Int) -> Action {
        guard case .connecting(var exchange, let app) = state, exchange.id == id, exchange.admitting else { return .none }
        state = .modifying
        exchange.admitting = false
        state = .connecting(exchange, app)
        return startExchange(exchange.plan)
    }

    /// Exchange `id` may not start: its proof was used before, or the store cannot say.
    mutating func refused(_ problem: GatehouseProblem, headers: [(String, String)], exchange id: Int) -> Action {
        guard case .connecting(let exchange, _) = state, exchange.id == id, exchange.admitting else { return .none }
        return answerProblem(problem, closing: nil, headers: headers)
    }

    private func startExchange(_ plan: FastRelayPlan) -> Action {
        // A request that is never sent twice takes only a connection used moments ago: a
        // backend closing an idle connection is a race it must not lose.
        let idleAtMost = plan.isIdempotent ? BackendConnectionPool.idleTimeout : BackendConnectionPool.freshForUnsafeMethods
        return .startExchange(plan.target, idleAtMost: idleAtMost)
    }

    /// Routes the next part queued behind an exchange that is over; `nil` when none is left
    /// or an exchange runs again.
    mutating func processNextQueuedPart() -> Action? {
        guard case .idle = state, let part = withAppConnection({ $0.queued.popFirst() }) else { return nil }
        return route(part)
    }

    /// The end of a read batch: whether it goes on (only when Hummingbird was handed something
    /// in it: its channel handler would otherwise look for reads after every fast request).
    mutating func readBatchEnded() -> Bool {
        withAppConnection { app in
            defer { app.passedOnInBatch = false }
            return app.passedOnInBatch
        }
    }

    /// Hummingbird wrote the end of an answer.
    mutating func generalAnswerEnded() {
        withAppConnection { $0.generalOutstanding -= 1 }
    }

    // MARK: The exchange

    /// The handler armed the timer and looked in the pool: `idle` is the connection it took.
    /// An exchange still waiting for its admission reaches no backend.
    mutating func exchangeStarted(at now: NIODeadline, idle: Backend?) -> Action {
        guard case .connecting(var exchange, let app) = state, !exchange.admitting else { return idle.map { .giveBack($0) } ?? .none }
        // An exchange that waited for its admission counts from then.
        if exchange.started == .distantPast { exchange.started = now }
        guard let idle else {
            state = .connecting(exchange, app)
            return .connect(exchange.plan.target, exchange: exchange.id)
        }
        exchange.reused = true
        return send(exchange, on: idle, app: app)
    }

    /// A new connection for exchange `id` arrived. A late one is given back.
    mutating func connected(_ backend: Backend, exchange id: Int) -> Action {
        guard case .connecting(var exchange, let app) = state, exchange.id == id, !exchange.admitting else { return .giveBack(backend) }
        exchange.reused = false
        return send(exchange, on: backend, app: app)
    }

    /// No connection could be made for exchange `id`.
    mutating func connectFailed(exchange id: Int) -> Action {
        guard case .connecting(let exchange, _) = state, exchange.id == id, !exchange.admitting else { return .none }
        return answerProblem(.backendUnavailable(), closing: nil)
    }

    private mutating func send(_ exchange: Exchange, on backend: Backend, app: AppConnection) -> Action {
        state = .awaitingHead(exchange, backend, app)
        return .send(exchange.plan.head, body: exchange.body, on: backend)
    }

    mutating func responseHeadReceived(_ head: HTTPResponseHead) -> Action {
        guard case .awaitingHead(let exchange, let backend, let app) = state else { return .none }
        // A pooled connection is given back reading, and a new one starts so.
        state = .streaming(exchange, backend, status: head.status.code, backendPaused: false, app)
        return .writeHead(head, requestID: exchange.plan.requestID, timeout: exchange.plan.target.timeout)
    }

    mutating func responseBodyReceived(_ buffer: ByteBuffer) -> Action {
        guard case .streaming(let exchange, _, _, _, _) = state else { return .none }
        return .writeBody(buffer, timeout: exchange.plan.target.timeout)
    }

    /// The backend's batch of reads is over: what was written to the app goes out.
    mutating func backendReadCompleted() -> Action {
        guard case .streaming = state else { return .none }
        return .flush
    }

    mutating func responseEndReceived(reusable: Bool) -> Action {
        guard case .streaming(let exchange, let backend, let status, let paused, let app) = state else { return .none }
        return .endAnswer(complete(exchange, status: status, app: app), backend: backend, reusable: reusable, resumeReading: paused)
    }

    /// The backend connection failed or closed before the answer ended.
    mutating func backendFailed() -> Action {
        switch state {
        case .idle, .connecting, .modifying:
            return .none
        case .streaming(let exchange, _, let status, _, let app):
            // The answer has begun: the app's connection cannot be saved.
            exchangeIsOver(exchange, app: app)
            return .breakOff(exchange, status: status, closing: nil)
        case .awaitingHead(var exchange, _, let app):
            guard exchange.reused, !exchange.retried, exchange.plan.isIdempotent else {
                return answerProblem(.backendUnavailable(), closing: nil)
            }
            // A pooled connection the backend had closed: an idempotent request is safe to send again.
            exchange.retried = true
            exchange.reused = false
            state = .connecting(exchange, app)
            return .connect(exchange.plan.target, exchange: exchange.id)
        }
    }

    /// The route's timeout: until the answer's head, then between two parts of its body (a
    /// backend that sends a head and falls silent must not hold two connections forever).
    mutating func timerFired() -> Action {
        switch state {
        case .idle, .modifying:
            return .none
        case .connecting(let exchange, _) where exchange.admitting:
            // The store did not record the proof in time: the backend was never asked.
            return answerProblem(.identityUnavailable(), closing: nil, headers: [("Retry-After", "1")])
        case .connecting:
            return answerProblem(.backendTimeout(), closing: nil)
        case .awaitingHead(_, let backend, _):
            return answerProblem(.backendTimeout(), closing: backend)
        case .streaming(let exchange, let backend, let status, _, let app):
            // The answer has begun and stalled: neither connection can be reused.
            exchangeIsOver(exchange, app: app)
            return .breakOff(exchange, status: status, closing: backend)
        }
    }

    /// Whether the app's connection takes more writes. Backpressure for large answers: the
    /// backend is read only as fast as the app takes the answer. Setting a channel option costs
    /// a future, so only a change is acted on.
    mutating func writabilityChanged(isWritable: Bool) -> Action {
        guard case .streaming(let exchange, let backend, let status, let paused, let app) = state, paused == isWritable else {
            return .none
        }
        state = .streaming(exchange, backend, status: status, backendPaused: !isWritable, app)
        return .setBackendReading(backend, isWritable)
    }

    /// Answers the exchange that has not begun its answer with `problem`.
    private mutating func answerProblem(_ problem: GatehouseProblem, closing: Backend?, headers: [(String, String)] = []) -> Action {
        switch state {
        case .connecting(let exchange, let app), .awaitingHead(let exchange, _, let app):
            return .answerProblem(problem, complete(exchange, status: UInt(problem.status), app: app), closing: closing, headers: headers)
        case .idle, .streaming, .modifying:
            return .none
        }
    }

    /// Back to `idle`: the exchange's `.end` may still be to come from the network.
    private mutating func exchangeIsOver(_ exchange: Exchange, app: AppConnection) {
        state = .idle(exchange.swallowsEnd ? .swallowing : .idle, app)
    }

    private mutating func complete(_ exchange: Exchange, status: UInt, app: AppConnection) -> Completion {
        exchangeIsOver(exchange, app: app)
        return Completion(exchange: exchange, status: status, reportsEndWritten: app.quiesce == .held, processesQueue: !app.queued.isEmpty)
    }

    // MARK: The connection

    /// The app's connection is gone.
    mutating func connectionClosed() -> Action {
        switch state {
        case .idle(.collecting, let app):
            state = .idle(.idle, app)
            return .stop(closing: nil)
        case .idle, .modifying:
            return .stop(closing: nil)
        case .connecting(let exchange, let app):
            exchangeIsOver(exchange, app: app)
            return .stop(closing: nil)
        case .awaitingHead(let exchange, let backend, let app), .streaming(let exchange, let backend, _, _, let app):
            exchangeIsOver(exchange, app: app)
            return .stop(closing: backend)
        }
    }

    /// The server drains. Hummingbird, behind the fast path, never saw the fast requests and
    /// would close the connection under them: the drain is held while fast work remains.
    mutating func quiesceRequested() -> Action {
        let busy = isBusy
        return withAppConnection { app in
            guard app.quiesce == .none else { return .none }
            if busy || !app.queued.isEmpty {
                app.quiesce = .held
                return .none
            }
            app.quiesce = .passedOn
            return .passQuiesceOn
        }
    }

    /// The end of a fast answer written while the drain was held (`Completion.reportsEndWritten`):
    /// the drain goes on once no fast work remains (Hummingbird then closes the connection, at
    /// once or after the answers it owes).
    mutating func answerEndWritten() -> Action {
        guard !isBusy else { return .none }
        return withAppConnection { app in
            guard app.quiesce == .held, app.queued.isEmpty else { return .none }
            app.quiesce = .passedOn
            return .passQuiesceOn
        }
    }

    /// Fast work remains: an exchange, or a request whose body is arriving.
    private var isBusy: Bool {
        switch state {
        case .idle(.collecting, _), .connecting, .awaitingHead, .streaming, .modifying: true
        case .idle: false
        }
    }

    // MARK: Changing a payload in place

    /// Changes the running exchange and the app's connection in place; `nil` when no exchange runs.
    private mutating func withExchange<Result>(_ change: (inout Exchange, inout AppConnection) -> Result) -> Result? {
        switch state {
        case .connecting(var exchange, var app):
            state = .modifying
            defer { state = .connecting(exchange, app) }
            return change(&exchange, &app)
        case .awaitingHead(var exchange, let backend, var app):
            state = .modifying
            defer { state = .awaitingHead(exchange, backend, app) }
            return change(&exchange, &app)
        case .streaming(var exchange, let backend, let status, let paused, var app):
            state = .modifying
            defer { state = .streaming(exchange, backend, status: status, backendPaused: paused, app) }
            return change(&exchange, &app)
        case .idle, .modifying:
            return nil
        }
    }

    /// Changes the app's connection in place, whatever the phase.
    private mutating func withAppConnection<Result>(_ change: (inout AppConnection) -> Result) -> Result {
        guard case .idle(let inbound, var app) = state else {
            guard let result = withExchange({ _, app in change(&app) }) else {
                preconditionFailure("the fast path's state is being changed")
            }
            return result
        }
        state = .modifying
        defer { state = .idle(inbound, app) }
        return change(&app)
    }
}
