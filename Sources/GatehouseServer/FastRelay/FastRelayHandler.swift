import Foundation
import GatehouseCore
import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1

/// Decides whether a request takes the fast path (`FastRelayPlanner`; a stand-in in tests).
protocol FastRelayPlanning: Sendable {
    /// `memo`: what the connection kept from its previous requests (`ConnectionMemo`).
    func plan(_ request: HTTPRequestHead, remoteAddress: String?, memo: inout ConnectionMemo) -> FastRelayPlan?
}

extension FastRelayPlanning {
    /// A plan for a request with no connection memo (tests).
    func plan(_ request: HTTPRequestHead, remoteAddress: String?) -> FastRelayPlan? {
        var memo = ConnectionMemo()
        return plan(request, remoteAddress: remoteAddress, memo: &memo)
    }
}

extension FastRelayPlanner: FastRelayPlanning {}

/// The relay's fast path, in the server's channel pipeline right after the connection's edge,
/// in front of Hummingbird's conversion to HTTP types: a request the planner accepts (a body of
/// at most 64 KiB, read whole first; a cached identity that passes the rule; an http or https
/// backend) is relayed on a pooled backend connection of the same event loop, with no task and
/// no hop between threads. Every other request goes on to Hummingbird unchanged, where the
/// general relay handles it.
///
/// Order is kept: a fast request starts only when Hummingbird owes no answer on this
/// connection, and requests pipelined behind a fast one wait until it has been answered.
///
/// Every exchange is counted as the general path counts a request (`RelayRouteMetrics`:
/// handles made once per route, atomic increments). When the server drains, the
/// `ChannelShouldQuiesceEvent` is held while an exchange or queued requests remain, and passed
/// on once the last answer is written: Hummingbird, behind this handler, never saw the fast
/// requests and would close the connection under them.
final class FastRelayHandler: ChannelDuplexHandler, RemovableChannelHandler, BackendExchangeDelegate {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// Parts a pipelining client may send while a fast exchange runs; more closes the connection.
    static let maximumQueuedParts = 256

    /// Where the parts of the request now arriving go.
    enum Inbound: Equatable {
        /// Between requests.
        case idle
        /// A request of Hummingbird's: its parts go on.
        case general
        /// The fast request's remaining parts (its `.end`): read and dropped.
        case swallowing
        /// The fast request's body: collected until its `.end`, then the exchange starts.
        case collecting
    }

    /// One fast exchange. `id` tells a late callback of an earlier exchange (a connect that
    /// finished after its 504) from the current one: such a callback never touches the current one.
    struct Exchange {
        let plan: FastRelayPlan
        /// The request's body (`nil` without one), kept to be sent again on a fresh connection.
        let body: ByteBuffer?
        let id: Int
        let started: NIODeadline
        /// The connection came from the idle pool (the backend may have closed it meanwhile).
        var reused = false
        /// A failed reused connection was already replaced once.
        var retried = false
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

    /// The fast exchange, explicitly: which callbacks are expected in each state.
    enum State {
        case idle
        /// Waiting for a backend connection.
        case connecting(Exchange)
        /// The request is sent; waiting for the answer's head.
        case awaitingHead(Exchange, BackendConnection)
        /// The answer's head went to the app; its body is being relayed.
        case streaming(Exchange, BackendConnection, status: UInt)
    }

    private let planner: any FastRelayPlanning
    private let pool: any BackendConnecting
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private var remoteAddress: String?

    private(set) var state: State = .idle
    private(set) var inbound: Inbound = .idle
    private(set) var quiesce: Quiesce = .none
    /// The metrics of the route last relayed on this connection (looked up once per connection and route).
    private var routeMetrics: (route: FastRoute, metrics: RelayRouteMetrics)?
    /// Requests handed to Hummingbird whose answer has not ended yet.
    private(set) var generalOutstanding = 0
    private var queued = CircularBuffer<HTTPServerRequestPart>()
    /// What this connection's previous requests left for the next (see `ConnectionMemo`).
    private var memo = ConnectionMemo()
    /// Reading the current exchange's backend connection is off (backpressure).
    private var backendPaused = false
    /// A part went on to Hummingbird since the last end of a read batch.
    private var passedOnInBatch = false
    /// The fast request whose body is arriving, and the body so far.
    private var collecting: (plan: FastRelayPlan, body: ByteBuffer?)?
    private var lastExchangeID = 0
    /// The route's timeout for the running exchange, and which exchange it belongs to.
    private var timer: LazyTimer?
    private var timedExchange = 0

    init(planner: any FastRelayPlanning, pool: any BackendConnecting, logger: Logger) {
        self.planner = planner
        self.pool = pool
        self.logger = logger
    }

    private var isExchanging: Bool {
        if case .idle = state { return false }
        return true
    }

    /// Fast work remains on this connection: an exchange, or a request whose body is arriving.
    private var isBusy: Bool { isExchanging || collecting != nil }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let timer = LazyTimer(eventLoop: context.eventLoop)
        timer.onExpiry = { [weak self] in
            guard let self else { return }
            self.timedOut(self.timedExchange)
        }
        self.timer = timer
        remoteAddress = context.channel.remoteAddress?.ipAddress
    }

    func channelActive(context: ChannelHandlerContext) {
        remoteAddress = context.channel.remoteAddress?.ipAddress
        context.fireChannelActive()
    }

    // MARK: Inbound: the app's requests

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard isExchanging else { return process(part, context: context) }
        // Parts still queued come first: an exchange started from the queue has its own `.end`
        // in there, and this part belongs to a later request.
        if inbound == .swallowing, queued.isEmpty {
            if case .end = part { inbound = .idle }
            return
        }
        guard queued.count < Self.maximumQueuedParts else {
            context.close(promise: nil)
            return
        }
        queued.append(part)
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let request):
            // Once the drain has gone on to Hummingbird, new requests go to it too (it answers them
            // with `Connection: close`); the fast path would keep a pipelining client's connection
            // open to the deadline. Requests queued while the drain is held are still served here.
            if generalOutstanding == 0, inbound != .general, quiesce != .passedOn,
               let plan = planner.plan(request, remoteAddress: remoteAddress, memo: &memo) {
                if plan.bodyLength > 0 {
                    inbound = .collecting
                    collecting = (plan, nil)  // nothing held before the body's bytes arrive
                } else {
                    inbound = .swallowing
                    start(plan, body: nil, context: context)
                }
            } else {
                generalOutstanding += 1
                inbound = .general
                passOn(part, context: context)
            }
        case .body(var bytes):
            if inbound == .general { return passOn(part, context: context) }
            guard inbound == .collecting, var pending = collecting else { return }
            collecting = nil  // the buffer stays uniquely referenced while it grows
            let held = pending.body?.readableBytes ?? 0
            guard held + bytes.readableBytes <= pending.plan.bodyLength else {
                // NIO's decoder frames the body by its Content-Length: this cannot happen.
                return context.close(promise: nil)
            }
            if pending.body == nil, bytes.readableBytes == pending.plan.bodyLength {
                pending.body = bytes  // the whole body in one part (the common case): no copy
            } else {
                // Grown as bytes arrive: a client announcing 64 KiB and sending nothing holds nothing.
                var body = pending.body ?? context.channel.allocator.buffer(capacity: min(pending.plan.bodyLength, max(4096, 2 * bytes.readableBytes)))
                body.writeBuffer(&bytes)
                pending.body = body
            }
            collecting = pending
        case .end:
            if inbound == .general { passOn(part, context: context) }
            let wasCollecting = inbound == .collecting
            inbound = .idle
            if wasCollecting, let pending = collecting {
                collecting = nil
                // Exactly the announced length, or the backend would read the next request as body.
                guard let body = pending.body, body.readableBytes == pending.plan.bodyLength else { return context.close(promise: nil) }
                start(pending.plan, body: body, context: context)
            }
        }
    }

    /// A part of a general request, on to Hummingbird.
    private func passOn(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        passedOnInBatch = true
        context.fireChannelRead(wrapInboundOut(part))
    }

    /// The end of a read batch goes on only when Hummingbird was handed something in it: its
    /// channel handler would otherwise look for reads to deliver after every fast request.
    func channelReadComplete(context: ChannelHandlerContext) {
        guard passedOnInBatch else { return }
        passedOnInBatch = false
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.stop()
        collecting = nil
        switch state {
        case .awaitingHead(_, let backend), .streaming(_, let backend, _):
            backend.handler.release(reusable: false)
        case .idle, .connecting:
            break
        }
        state = .idle
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent else { return context.fireUserInboundEventTriggered(event) }
        guard quiesce == .none else { return }
        if isBusy || !queued.isEmpty {
            quiesce = .held
        } else {
            quiesce = .passedOn
            context.fireUserInboundEventTriggered(event)
        }
    }

    /// Passes a held drain on once no fast work remains (Hummingbird then closes the
    /// connection, at once or after the answers it owes).
    private func passQuiesceOnIfIdle() {
        guard quiesce == .held, !isBusy, queued.isEmpty, let context else { return }
        quiesce = .passedOn
        context.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
    }

    /// Writes the end of a fast answer. While a drain is held, the drain goes on once the
    /// answer's last bytes are written (a close before would drop them).
    private func writeEnd(context: ChannelHandlerContext) {
        guard quiesce == .held else { return context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil) }
        let written = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: written)
        // Looked at once this exchange is over and its queue processed (the write may complete
        // at once, within this call): later on the event loop, never inline.
        written.futureResult.assumeIsolated().whenComplete { [weak self] _ in
            context.eventLoop.assumeIsolated().execute { self?.passQuiesceOnIfIdle() }
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        // Backpressure for large answers: read the backend only as fast as the app takes it.
        if case .streaming(_, let backend, _) = state {
            setBackendReading(backend, context.channel.isWritable)
        }
        context.fireChannelWritabilityChanged()
    }

    /// Turns reading the backend's answer off (the app reads slower than the backend sends) or
    /// back on. Setting a channel option costs a future: done only when the state changes.
    private func setBackendReading(_ backend: BackendConnection, _ reading: Bool) {
        guard backendPaused == reading else { return }
        backendPaused = !reading
        backend.channel.setOption(ChannelOptions.autoRead, value: reading).whenFailure { _ in }
    }

    // MARK: Outbound: Hummingbird's answers pass through

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { generalOutstanding -= 1 }
        context.write(data, promise: promise)
    }

    // MARK: The fast exchange

    private func start(_ plan: FastRelayPlan, body: ByteBuffer?, context: ChannelHandlerContext) {
        lastExchangeID &+= 1
        var exchange = Exchange(plan: plan, body: body, id: lastExchangeID, started: .now())
        armTimer(exchange, context: context)
        let idleAtMost = plan.isIdempotent ? BackendConnectionPool.idleTimeout : BackendConnectionPool.freshForUnsafeMethods
        if let idle = pool.idleConnection(to: plan.target, on: context.eventLoop, idleAtMost: idleAtMost) {
            exchange.reused = true
            send(exchange, on: idle)
            return
        }
        state = .connecting(exchange)
        pool.connect(to: plan.target, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
            self?.connected(result.map { ($0, false) }, for: exchange.id)
        }
    }

    /// A connection for exchange `id` arrived (or failed). A late one is given back.
    private func connected(_ result: Result<(BackendConnection, Bool), any Error>, for id: Int) {
        guard case .connecting(var exchange) = state, exchange.id == id else {
            if case .success(let (connection, _)) = result { connection.handler.release(reusable: true) }
            return
        }
        switch result {
        case .success(let (connection, reused)):
            exchange.reused = reused
            send(exchange, on: connection)
        case .failure:
            answerProblem(.backendUnavailable())
        }
    }

    private func send(_ exchange: Exchange, on connection: BackendConnection) {
        state = .awaitingHead(exchange, connection)
        backendPaused = false  // a pooled connection is given back reading; a new one starts so
        connection.handler.send(exchange.plan.head, body: exchange.body, delegate: self)
    }

    func backendResponseHead(_ head: HTTPResponseHead) {
        guard let context, case .awaitingHead(let exchange, let backend) = state else { return }
        state = .streaming(exchange, backend, status: head.status.code)
        armTimer(exchange, context: context)  // from now on: the longest silence allowed within the body
        let headers = RelayHeaderPolicy.relayedResponseHeaders(head.headers, requestID: exchange.plan.requestID)
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: head.status, headers: headers))), promise: nil)
    }

    func backendResponseBody(_ buffer: ByteBuffer) {
        guard let context, case .streaming(let exchange, let backend, _) = state else { return }
        armTimer(exchange, context: context)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        if !context.channel.isWritable {
            // Stop reading the backend first: the flush below may make the channel writable
            // again at once, and `channelWritabilityChanged` then turns reading back on.
            setBackendReading(backend, false)
            context.flush()
        }
    }

    func backendReadComplete() {
        guard let context, case .streaming = state else { return }
        context.flush()
    }

    func backendResponseEnd(reusable: Bool) {
        guard let context, case .streaming(let exchange, let backend, let status) = state else { return }
        timer?.disarm()
        writeEnd(context: context)
        if backendPaused { setBackendReading(backend, true) }
        backend.handler.release(reusable: reusable)
        finish(exchange, status: status)
    }

    func backendFailed(_ error: any Error, beforeHead: Bool) {
        guard let context else { return }
        switch state {
        case .idle, .connecting:
            return
        case .streaming(let exchange, _, let status):
            // The answer has begun: the app's connection cannot be saved.
            timer?.disarm()
            state = .idle
            count(exchange, status: status)
            context.close(promise: nil)
        case .awaitingHead(var exchange, _):
            guard exchange.reused, !exchange.retried, exchange.plan.isIdempotent else { return answerProblem(.backendUnavailable()) }
            // A pooled connection the backend had closed: an idempotent request is safe to send again.
            exchange.retried = true
            exchange.reused = false
            state = .connecting(exchange)
            let id = exchange.id
            pool.connect(to: exchange.plan.target, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
                self?.connected(result.map { ($0, false) }, for: id)
            }
        }
    }

    /// The route's timeout: until the answer's head, then between two parts of its body
    /// (a backend that sends a head and falls silent must not hold two connections forever).
    private func armTimer(_ exchange: Exchange, context: ChannelHandlerContext) {
        timedExchange = exchange.id
        timer?.arm(in: exchange.plan.target.timeout)
    }

    private func timedOut(_ id: Int) {
        switch state {
        case .connecting(let exchange) where exchange.id == id:
            answerProblem(.backendTimeout())
        case .awaitingHead(let exchange, let backend) where exchange.id == id:
            backend.handler.release(reusable: false)
            answerProblem(.backendTimeout())
        case .streaming(let exchange, let backend, let status) where exchange.id == id:
            // The answer has begun and stalled: neither connection can be reused.
            backend.handler.release(reusable: false)
            state = .idle
            count(exchange, status: status)
            context?.close(promise: nil)
        default:
            break
        }
    }

    /// Answers the exchange that has not begun its answer with `problem`.
    private func answerProblem(_ problem: GatehouseProblem) {
        let exchange: Exchange
        switch state {
        case .connecting(let current), .awaitingHead(let current, _): exchange = current
        case .idle, .streaming: return
        }
        guard let context else { return }
        timer?.disarm()
        let plan = exchange.plan
        let (head, body) = ProblemBody.responseParts(problem, instance: plan.path, requestID: plan.requestID)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !plan.isHead { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        writeEnd(context: context)
        logger.warning("fast relay answered \(problem.code)", metadata: ["route": .string(plan.target.route.prefix)])
        finish(exchange, status: UInt(problem.status))
    }

    private func finish(_ exchange: Exchange, status: UInt) {
        state = .idle
        let plan = exchange.plan
        let nanoseconds = count(exchange, status: status)
        if logger.logLevel <= .info {
            let elapsed = Double(nanoseconds) / 1_000_000
            var metadata: Logger.Metadata = [
                "request_id": .string(plan.requestID), "method": .string(plan.head.method.rawValue),
                "path": .string(plan.path), "relay": "fast", "status": .stringConvertible(status),
                "ms": .string(String(format: "%.1f", elapsed)),
            ]
            if let clientRequestID = plan.clientRequestID { metadata["client_request_id"] = .string(clientRequestID) }
            logger.info("request", metadata: metadata)
        }
        guard let context, !queued.isEmpty else { return }
        while !isExchanging, let part = queued.popFirst() {
            process(part, context: context)
        }
        // Hummingbird's channel delivers what it was handed at the end of a read batch.
        if passedOnInBatch {
            passedOnInBatch = false
            context.fireChannelReadComplete()
        }
    }

    /// Counts a finished (or broken-off) exchange; returns its duration in nanoseconds.
    @discardableResult
    private func count(_ exchange: Exchange, status: UInt) -> Int64 {
        let nanoseconds = (NIODeadline.now() - exchange.started).nanoseconds
        metrics(for: exchange.plan.target).record(method: exchange.plan.head.method.rawValue, status: Int(status), nanoseconds: nanoseconds)
        return nanoseconds
    }

    /// The handles of `route`: kept for the connection's next exchange on the same route.
    private func metrics(for target: FastRoute) -> RelayRouteMetrics {
        if let routeMetrics, routeMetrics.route === target { return routeMetrics.metrics }
        let metrics = RequestMetrics.fastRelay(target.route)
        routeMetrics = (target, metrics)
        return metrics
    }
}
