import Foundation
import GatehouseCore
import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1

/// Decides whether a request takes the fast path (`FastRelayPlanner`; a stand-in in tests).
protocol FastRelayPlanning: Sendable {
    func plan(_ request: HTTPRequestHead, remoteAddress: String?) -> FastRelayPlan?
}

extension FastRelayPlanner: FastRelayPlanning {}

/// The relay's fast path, in the server's channel pipeline right after the connection's edge,
/// in front of Hummingbird's conversion to HTTP types: a request the planner accepts (no body,
/// cached identity that passes the rule, plain-http backend) is relayed on a pooled backend
/// connection of the same event loop, with no task, no hop between threads and no copy of the
/// body. Every other request goes on to Hummingbird unchanged, where the general relay handles it.
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
    }

    /// One fast exchange. `id` tells a late callback of an earlier exchange (a connect that
    /// finished after its 504) from the current one: such a callback never touches the current one.
    struct Exchange {
        let plan: FastRelayPlan
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
    private var routeMetrics: (prefix: String, metrics: RelayRouteMetrics)?
    /// Requests handed to Hummingbird whose answer has not ended yet.
    private(set) var generalOutstanding = 0
    private var queued = CircularBuffer<HTTPServerRequestPart>()
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
               let plan = planner.plan(request, remoteAddress: remoteAddress) {
                inbound = .swallowing
                start(plan, context: context)
            } else {
                generalOutstanding += 1
                inbound = .general
                context.fireChannelRead(wrapInboundOut(part))
            }
        case .body:
            if inbound == .general { context.fireChannelRead(wrapInboundOut(part)) }
        case .end:
            if inbound == .general { context.fireChannelRead(wrapInboundOut(part)) }
            inbound = .idle
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.stop()
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
        if isExchanging || !queued.isEmpty {
            quiesce = .held
        } else {
            quiesce = .passedOn
            context.fireUserInboundEventTriggered(event)
        }
    }

    /// Passes a held drain on once no fast work remains (Hummingbird then closes the
    /// connection, at once or after the answers it owes).
    private func passQuiesceOnIfIdle() {
        guard quiesce == .held, !isExchanging, queued.isEmpty, let context else { return }
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
            backend.channel.setOption(ChannelOptions.autoRead, value: context.channel.isWritable).whenFailure { _ in }
        }
        context.fireChannelWritabilityChanged()
    }

    // MARK: Outbound: Hummingbird's answers pass through

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { generalOutstanding -= 1 }
        context.write(data, promise: promise)
    }

    // MARK: The fast exchange

    private func start(_ plan: FastRelayPlan, context: ChannelHandlerContext) {
        lastExchangeID &+= 1
        var exchange = Exchange(plan: plan, id: lastExchangeID, started: .now())
        armTimer(exchange, context: context)
        if let idle = pool.idleConnection(to: plan.backend, on: context.eventLoop) {
            exchange.reused = true
            send(exchange, on: idle)
            return
        }
        state = .connecting(exchange)
        pool.connection(to: plan.backend, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
            self?.connected(result.map { ($0.0, $0.reused) }, for: exchange.id)
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
        connection.handler.send(exchange.plan.head, delegate: self)
    }

    func backendResponseHead(_ head: HTTPResponseHead) {
        guard let context, case .awaitingHead(let exchange, let backend) = state else { return }
        state = .streaming(exchange, backend, status: head.status.code)
        armTimer(exchange, context: context)  // from now on: the longest silence allowed within the body
        var head = head
        let connectionValues = head.headers["connection"]
        if !connectionValues.isEmpty {
            for token in RelayHeaderPolicy.connectionTokens(connectionValues) { head.headers.remove(name: token) }
        }
        if head.headers.contains(where: { RelayHeaderPolicy.isHopByHop($0.name) }) {
            for name in RelayHeaderPolicy.hopByHop { head.headers.remove(name: name) }
        }
        head.headers.replaceOrAdd(name: "X-Request-Id", value: exchange.plan.requestID)
        head.version = .http1_1
        context.write(wrapOutboundOut(.head(head)), promise: nil)
    }

    func backendResponseBody(_ buffer: ByteBuffer) {
        guard let context, case .streaming(let exchange, let backend, _) = state else { return }
        armTimer(exchange, context: context)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        if !context.channel.isWritable {
            // Stop reading the backend first: the flush below may make the channel writable
            // again at once, and `channelWritabilityChanged` then turns reading back on.
            backend.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
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
        backend.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
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
            guard exchange.reused, !exchange.retried else { return answerProblem(.backendUnavailable()) }
            // A pooled connection the backend had closed: GET and HEAD are safe to send again.
            exchange.retried = true
            exchange.reused = false
            state = .connecting(exchange)
            let id = exchange.id
            pool.connect(to: exchange.plan.backend, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
                self?.connected(result.map { ($0, false) }, for: id)
            }
        }
    }

    /// The route's timeout: until the answer's head, then between two parts of its body
    /// (a backend that sends a head and falls silent must not hold two connections forever).
    private func armTimer(_ exchange: Exchange, context: ChannelHandlerContext) {
        timedExchange = exchange.id
        timer?.arm(in: .nanoseconds(exchange.plan.route.timeout.inNanoseconds))
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
        logger.warning("fast relay answered \(problem.code)", metadata: ["route": .string(plan.route.prefix)])
        finish(exchange, status: UInt(problem.status))
    }

    private func finish(_ exchange: Exchange, status: UInt) {
        state = .idle
        let plan = exchange.plan
        let nanoseconds = count(exchange, status: status)
        if logger.logLevel <= .info {
            let elapsed = Double(nanoseconds) / 1_000_000
            var metadata: Logger.Metadata = [
                "request_id": .string(plan.requestID), "method": .string(plan.isHead ? "HEAD" : "GET"),
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
        context.fireChannelReadComplete()
    }

    /// Counts a finished (or broken-off) exchange; returns its duration in nanoseconds.
    @discardableResult
    private func count(_ exchange: Exchange, status: UInt) -> Int64 {
        let nanoseconds = (NIODeadline.now() - exchange.started).nanoseconds
        metrics(for: exchange.plan.route).record(isHead: exchange.plan.isHead, status: Int(status), nanoseconds: nanoseconds)
        return nanoseconds
    }

    /// The handles of `route`: kept for the connection's next exchange on the same route.
    private func metrics(for route: RouteSettings) -> RelayRouteMetrics {
        if let routeMetrics, routeMetrics.prefix == route.prefix { return routeMetrics.metrics }
        let metrics = RequestMetrics.fastRelay(route)
        routeMetrics = (route.prefix, metrics)
        return metrics
    }
}
