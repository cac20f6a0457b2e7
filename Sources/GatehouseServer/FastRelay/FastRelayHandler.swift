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
///
/// Every decision is `FastRelayStateMachine`'s: this handler hands it the events of the app's
/// channel, the planner's answers and the backend's, and carries out the action each returns.
final class FastRelayHandler: ChannelDuplexHandler, RemovableChannelHandler, BackendExchangeDelegate {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart
    private typealias Machine = FastRelayStateMachine<BackendConnection>

    /// Parts a pipelining client may send while a fast exchange runs; more closes the connection.
    static let maximumQueuedParts = 256

    private let planner: any FastRelayPlanning
    private let pool: any BackendConnecting
    private let logger: Logger
    private let accessLog: AccessLog
    private var machine = Machine(maximumQueuedParts: FastRelayHandler.maximumQueuedParts)
    private var context: ChannelHandlerContext?
    /// The route's timeout for the running exchange.
    private var timer: LazyTimer?
    private var remoteAddress: String?
    /// What this connection's previous requests left the planner (see `ConnectionMemo`).
    private var memo = ConnectionMemo()
    /// The metrics of the route last relayed on this connection (looked up once per connection and route).
    private var routeMetrics: (route: FastRoute, metrics: RelayRouteMetrics)?

    /// Where the fast path of this connection stands.
    var state: FastRelayStateMachine<BackendConnection>.State { machine.state }

    init(planner: any FastRelayPlanning, pool: any BackendConnecting, logger: Logger, accessLog: AccessLog = .throughLogger) {
        self.planner = planner
        self.pool = pool
        self.logger = logger
        self.accessLog = accessLog
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let timer = LazyTimer(eventLoop: context.eventLoop)
        timer.onExpiry = { [weak self] in
            guard let self, let context = self.context else { return }
            self.perform(self.machine.timerFired(), context: context)
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
        perform(machine.requestPartRead(unwrapInboundIn(data)), context: context)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if machine.readBatchEnded() { context.fireChannelReadComplete() }
    }

    func channelInactive(context: ChannelHandlerContext) {
        perform(machine.connectionClosed(), context: context)
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ChannelShouldQuiesceEvent else { return context.fireUserInboundEventTriggered(event) }
        perform(machine.quiesceRequested(), context: context)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        perform(machine.writabilityChanged(isWritable: context.channel.isWritable), context: context)
        context.fireChannelWritabilityChanged()
    }

    // MARK: Outbound: Hummingbird's answers pass through

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { machine.generalAnswerEnded() }
        context.write(data, promise: promise)
    }

    // MARK: The backend's answer

    func backendResponseHead(_ head: HTTPResponseHead) {
        guard let context else { return }
        perform(machine.responseHeadReceived(head), context: context)
    }

    func backendResponseBody(_ buffer: ByteBuffer) {
        guard let context else { return }
        perform(machine.responseBodyReceived(buffer), context: context)
    }

    func backendReadComplete() {
        guard let context else { return }
        perform(machine.backendReadCompleted(), context: context)
    }

    func backendResponseEnd(reusable: Bool) {
        guard let context else { return }
        perform(machine.responseEndReceived(reusable: reusable), context: context)
    }

    func backendFailed(_ error: any Error, beforeHead: Bool) {
        guard let context else { return }
        perform(machine.backendFailed(), context: context)
    }

    // MARK: Carrying out the state machine's actions

    private func perform(_ action: Machine.Action, context: ChannelHandlerContext) {
        switch action {
        case .none:
            break
        case .passOn(let part):
            context.fireChannelRead(wrapInboundOut(part))
        case .plan(let head):
            let plan = planner.plan(head, remoteAddress: remoteAddress, memo: &memo)
            perform(machine.planned(plan, for: head), context: context)
        case .admit(let proof, let target, let exchange):
            timer?.arm(in: target.timeout)
            machine.admissionStarted(at: NIODeadline.now())
            admit(proof, exchange: exchange, context: context)
        case .startExchange(let target, let idleAtMost):
            let now = NIODeadline.now()
            timer?.arm(in: target.timeout)
            let idle = pool.idleConnection(to: target, on: context.eventLoop, idleAtMost: idleAtMost)
            perform(machine.exchangeStarted(at: now, idle: idle), context: context)
        case .connect(let target, let exchange):
            pool.connect(to: target, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
                guard let self, let context = self.context else { return }
                switch result {
                case .success(let backend): self.perform(self.machine.connected(backend, exchange: exchange), context: context)
                case .failure: self.perform(self.machine.connectFailed(exchange: exchange), context: context)
                }
            }
        case .send(let head, let body, let backend):
            backend.handler.send(head, body: body, delegate: self)
        case .giveBack(let backend):
            backend.handler.release(reusable: true)
        case .writeHead(let head, let requestID, let timeout):
            timer?.arm(in: timeout)
            let headers = RelayHeaderPolicy.relayedResponseHeaders(head.headers, requestID: requestID)
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: head.status, headers: headers))), promise: nil)
        case .writeBody(let buffer, let timeout):
            timer?.arm(in: timeout)
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            if !context.channel.isWritable {
                // Stop reading the backend first: the flush below may make the channel writable
                // again at once, and `channelWritabilityChanged` then turns reading back on.
                perform(machine.writabilityChanged(isWritable: false), context: context)
                context.flush()
            }
        case .flush:
            context.flush()
        case .setBackendReading(let backend, let reading):
            backend.channel.setOption(ChannelOptions.autoRead, value: reading).whenFailure { _ in }
        case .endAnswer(let completion, let backend, let reusable, let resumeReading):
            timer?.disarm()
            writeEnd(reportingWritten: completion.reportsEndWritten, context: context)
            if resumeReading { backend.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in } }
            backend.handler.release(reusable: reusable)
            complete(completion, context: context)
        case .answer(let head, let completion):
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            writeEnd(reportingWritten: completion.reportsEndWritten, context: context)
            complete(completion, context: context)
        case .answerProblem(let problem, let completion, let closing, let headers):
            closing?.handler.release(reusable: false)
            timer?.disarm()
            let plan = completion.exchange.plan
            var (head, body) = ProblemBody.responseParts(problem, instance: plan.path, requestID: plan.requestID)
            head.headers.add(contentsOf: headers)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            if !plan.isHead { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
            writeEnd(reportingWritten: completion.reportsEndWritten, context: context)
            // A replayed proof is the caller's doing (the general path does not warn of it either).
            logger.log(level: problem.status == 401 ? .info : .warning, "fast relay answered \(problem.code)",
                       metadata: ["route": .string(plan.target.route.prefix)])
            complete(completion, context: context)
        case .breakOff(let exchange, let status, let closing):
            closing?.handler.release(reusable: false)
            timer?.disarm()
            count(exchange, status: status)
            context.close(promise: nil)
        case .close:
            context.close(promise: nil)
        case .passQuiesceOn:
            context.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        case .stop(let closing):
            timer?.stop()
            closing?.handler.release(reusable: false)
        }
    }

    /// Writes the first use of a DPoP proof to the store (the replay protection every instance
    /// and a restart share), then lets the exchange start, or answers as the general path would.
    private func admit(_ proof: FastProofRecord, exchange: Int, context: ChannelHandlerContext) {
        let dpop = proof.dpop
        context.eventLoop.makeFutureWithTask { await dpop.record(proof.spend) }.assumeIsolated().whenSuccess { [weak self] use in
            guard let self, let context = self.context else { return }
            if let (problem, headers) = dpop.refusal(of: use) {
                self.perform(self.machine.refused(problem, headers: headers, exchange: exchange), context: context)
            } else {
                self.perform(self.machine.admitted(exchange: exchange), context: context)
            }
        }
    }

    /// Writes the end of a fast answer; when asked, reports once it is written.
    private func writeEnd(reportingWritten: Bool, context: ChannelHandlerContext) {
        guard reportingWritten else { return context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil) }
        let written = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: written)
        // Reported once this exchange is over and its queue processed (the write may complete
        // at once, within this call): later on the event loop, never inline.
        written.futureResult.assumeIsolated().whenComplete { [weak self] _ in
            context.eventLoop.assumeIsolated().execute {
                guard let self, let context = self.context else { return }
                self.perform(self.machine.answerEndWritten(), context: context)
            }
        }
    }

    /// Counts and logs an answered exchange, then routes the parts queued behind it.
    private func complete(_ completion: Machine.Completion, context: ChannelHandlerContext) {
        let plan = completion.exchange.plan
        let nanoseconds = count(completion.exchange, status: completion.status)
        accessLog.record(RequestLine(requestID: plan.requestID, method: plan.head.method.rawValue, path: plan.path,
                                     status: Int(completion.status), nanoseconds: nanoseconds, relay: .fast,
                                     clientRequestID: plan.clientRequestID), logger: logger)
        guard completion.processesQueue else { return }
        while let action = machine.processNextQueuedPart() {
            perform(action, context: context)
        }
        // Hummingbird's channel delivers what it was handed at the end of a read batch.
        if machine.readBatchEnded() { context.fireChannelReadComplete() }
    }

    /// Counts a finished (or broken-off) exchange; returns its duration in nanoseconds.
    @discardableResult
    private func count(_ exchange: Machine.Exchange, status: UInt) -> Int64 {
        if let decidedAt = exchange.plan.decidedAt {
            // A forward-auth decision: counted as the general path counts one (route `/forward-auth`).
            let elapsed = NIODeadline.now() - decidedAt
            RequestMetrics.record(route: ForwardAuthSettings.path, method: exchange.plan.head.method.rawValue, status: Int(status),
                                  relayed: false, elapsed: .nanoseconds(elapsed.nanoseconds))
            return elapsed.nanoseconds
        }
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
