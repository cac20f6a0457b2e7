import Foundation
import GatehouseCore
import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypesHTTP1

/// The relay's fast path, in the server's channel pipeline right after the HTTP/1.1 codec,
/// in front of Hummingbird's conversion to HTTP types: a request `FastRelayPlanner` accepts (no body, cached identity that passes
/// the rule, plain-http backend) is relayed on a pooled backend connection of the same event
/// loop, with no task, no hop between threads and no copy of the body. Every other request
/// goes on to Hummingbird unchanged, where the general relay handles it.
///
/// Order is kept: a fast request starts only when Hummingbird owes no answer on this
/// connection, and requests pipelined behind a fast one wait until it has been answered.
final class FastRelayHandler: ChannelDuplexHandler, RemovableChannelHandler, BackendExchangeDelegate {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// Parts a pipelining client may send while a fast exchange runs; more closes the connection.
    static let maximumQueuedParts = 256

    private let planner: FastRelayPlanner
    private let pool: BackendConnectionPool
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private var remoteAddress: String?

    /// Requests handed to Hummingbird whose answer has not ended yet.
    private var generalOutstanding = 0
    /// The inbound request now arriving belongs to Hummingbird.
    private var forwardingInbound = false
    /// The fast request's own remaining parts (its `.end`) are still to be read and dropped.
    private var swallowingFastRequest = false
    private var queued = CircularBuffer<HTTPServerRequestPart>()

    private var current: FastRelayPlan?
    /// Tells a late callback of an earlier exchange (a connect that finished after its 504)
    /// from the current one: such a callback must never touch the current exchange.
    private var exchangeID = 0
    private var backend: BackendConnection?
    private var reused = false
    private var retried = false
    private var responseStarted = false
    private var timeout: Scheduled<Void>?
    private var started = NIODeadline.now()

    init(planner: FastRelayPlanner, pool: BackendConnectionPool, logger: Logger) {
        self.planner = planner
        self.pool = pool
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        remoteAddress = context.channel.remoteAddress?.ipAddress
    }

    func channelActive(context: ChannelHandlerContext) {
        remoteAddress = context.channel.remoteAddress?.ipAddress
        context.fireChannelActive()
    }

    // MARK: Inbound: the app's requests

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if current != nil {
            if swallowingFastRequest {
                if case .end = part { swallowingFastRequest = false }
                return
            }
            guard queued.count < Self.maximumQueuedParts else {
                context.close(promise: nil)
                return
            }
            queued.append(part)
            return
        }
        process(part, context: context)
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let request):
            if generalOutstanding == 0, !forwardingInbound, let plan = planner.plan(request, remoteAddress: remoteAddress) {
                swallowingFastRequest = true
                start(plan, context: context)
            } else {
                generalOutstanding += 1
                forwardingInbound = true
                context.fireChannelRead(wrapInboundOut(part))
            }
        case .body:
            if forwardingInbound { context.fireChannelRead(wrapInboundOut(part)) }
        case .end:
            if forwardingInbound {
                forwardingInbound = false
                context.fireChannelRead(wrapInboundOut(part))
            } else {
                swallowingFastRequest = false
            }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if current != nil {
            timeout?.cancel()
            backend?.handler.release(reusable: false)
            backend = nil
            current = nil
        }
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        // Backpressure for large answers: read the backend only as fast as the app takes it.
        if let backend, current != nil {
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
        current = plan
        exchangeID &+= 1
        let exchange = exchangeID
        retried = false
        responseStarted = false
        started = .now()
        armTimer(plan, context: context)
        if let idle = pool.idleConnection(to: plan.backend, on: context.eventLoop) {
            backend = idle
            reused = true
            idle.handler.send(plan.head, delegate: self)
            return
        }
        pool.connection(to: plan.backend, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
            guard let self, self.current != nil, self.exchangeID == exchange else {
                if case .success(let (connection, _)) = result { connection.handler.release(reusable: true) }
                return
            }
            switch result {
            case .success(let (connection, reused)):
                self.backend = connection
                self.reused = reused
                connection.handler.send(plan.head, delegate: self)
            case .failure:
                self.answerProblem(.backendUnavailable())
            }
        }
    }

    func backendResponseHead(_ head: HTTPResponseHead) {
        guard let context, let plan = current else { return }
        responseStarted = true
        armTimer(plan, context: context)  // from now on: the longest silence allowed within the body
        var head = head
        let connectionValues = head.headers["connection"]
        if !connectionValues.isEmpty {
            for token in RelayHeaderPolicy.connectionTokens(connectionValues) { head.headers.remove(name: token) }
        }
        if head.headers.contains(where: { RelayHeaderPolicy.isHopByHop($0.name) }) {
            for name in RelayHeaderPolicy.hopByHop { head.headers.remove(name: name) }
        }
        head.headers.replaceOrAdd(name: "X-Request-Id", value: plan.requestID)
        head.version = .http1_1
        context.write(wrapOutboundOut(.head(head)), promise: nil)
    }

    func backendResponseBody(_ buffer: ByteBuffer) {
        guard let context, let plan = current else { return }
        armTimer(plan, context: context)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        if !context.channel.isWritable {
            // Stop reading the backend first: the flush below may make the channel writable
            // again at once, and `channelWritabilityChanged` then turns reading back on.
            backend?.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
            context.flush()
        }
    }

    func backendReadComplete() {
        guard let context, current != nil, responseStarted else { return }
        context.flush()
    }

    func backendResponseEnd(reusable: Bool) {
        guard let context, let plan = current else { return }
        timeout?.cancel()
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        backend?.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
        backend?.handler.release(reusable: reusable)
        backend = nil
        finish(plan)
    }

    func backendFailed(_ error: any Error, beforeHead: Bool) {
        guard let context, let plan = current else { return }
        backend = nil
        guard beforeHead else {
            // The answer has begun: the app's connection cannot be saved.
            timeout?.cancel()
            current = nil
            context.close(promise: nil)
            return
        }
        if reused, !retried {
            // A pooled connection the backend had closed: GET and HEAD are safe to send again.
            retried = true
            let exchange = exchangeID
            pool.connect(to: plan.backend, on: context.eventLoop).assumeIsolated().whenComplete { [weak self] result in
                guard let self, self.current != nil, self.exchangeID == exchange else {
                    if case .success(let connection) = result { connection.handler.release(reusable: true) }
                    return
                }
                switch result {
                case .success(let connection):
                    self.backend = connection
                    self.reused = false
                    connection.handler.send(plan.head, delegate: self)
                case .failure:
                    self.answerProblem(.backendUnavailable())
                }
            }
            return
        }
        answerProblem(.backendUnavailable())
    }

    /// The route's timeout: until the answer's head, then between two parts of its body
    /// (a backend that sends a head and falls silent must not hold two connections forever).
    private func armTimer(_ plan: FastRelayPlan, context: ChannelHandlerContext) {
        timeout?.cancel()
        let exchange = exchangeID
        timeout = context.eventLoop.assumeIsolated().scheduleTask(in: .nanoseconds(plan.route.timeout.inNanoseconds)) { [weak self] in
            guard let self, self.exchangeID == exchange else { return }
            self.timedOut()
        }
    }

    private func timedOut() {
        guard current != nil else { return }
        backend?.handler.release(reusable: false)
        backend = nil
        guard responseStarted else { return answerProblem(.backendTimeout()) }
        // The answer has begun and stalled: neither connection can be reused.
        current = nil
        context?.close(promise: nil)
    }

    private func answerProblem(_ problem: GatehouseProblem) {
        guard let context, let plan = current else { return }
        timeout?.cancel()
        let body = JSONCoding.encode(ProblemBody(problem, instance: plan.path))
        let headers: HTTPHeaders = [
            "Content-Type": "application/problem+json", "Cache-Control": "no-store",
            "Content-Length": String(body.count), "X-Request-Id": plan.requestID,
        ]
        let head = HTTPResponseHead(version: .http1_1, status: .init(statusCode: problem.status), headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !plan.isHead { context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        logger.warning("fast relay answered \(problem.code)", metadata: ["route": .string(plan.route.prefix)])
        finish(plan)
    }

    private func finish(_ plan: FastRelayPlan) {
        current = nil
        if logger.logLevel <= .info {
            let elapsed = Double((NIODeadline.now() - started).nanoseconds) / 1_000_000
            logger.info("request", metadata: [
                "request_id": .string(plan.requestID), "method": .string(plan.isHead ? "HEAD" : "GET"),
                "path": .string(plan.path), "fast": "true", "ms": .string(String(format: "%.1f", elapsed)),
            ])
        }
        guard let context, !queued.isEmpty else { return }
        while current == nil, let part = queued.popFirst() {
            process(part, context: context)
        }
        // Hummingbird's channel delivers what it was handed at the end of a read batch.
        context.fireChannelReadComplete()
    }
}

/// Added by Hummingbird with the other per-connection handlers (after its HTTP-types codec);
/// moves the fast path in front of that codec, where requests are still NIOHTTP1 parts, so
/// a relayed request is never converted to HTTP types and back.
final class FastRelayInstaller: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = Never
    private let makeHandler: () -> FastRelayHandler

    init(_ makeHandler: @escaping () -> FastRelayHandler) {
        self.makeHandler = makeHandler
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let operations = context.pipeline.syncOperations
        if let codec = try? operations.handler(type: HTTP1ToHTTPServerCodec.self) {
            try? operations.addHandler(makeHandler(), position: .before(codec))
        }
        operations.removeHandler(context: context, promise: nil)
    }
}
