import Foundation
import GatehouseCore
import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypesHTTP1
import Synchronization

/// Asks the connection's edge to send `100 Continue` (RFC 9110 §10.1.1) before a handler
/// reads the request body. Sent as a user outbound event from wherever the body is read;
/// ignored when the request did not ask for it or another answer is already under way.
struct SendContinue: Sendable {}

/// Each client connection's edge, right after the HTTP/1.1 codec and before the relay's fast
/// path and Hummingbird: the head-read and keep-alive idle timeouts, connection-level refusals
/// of what RFC 9112 says a server must not act on (a missing or repeated `Host`, a transfer
/// coding other than `chunked`, an unknown expectation), and `100 Continue`.
final class ConnectionEdgeHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let headerReadTimeout: TimeAmount
    private let bodyReadTimeout: TimeAmount
    private let idleTimeout: TimeAmount
    private let logger: Logger
    private var state = ConnectionEdgeStateMachine()
    /// The head, body or idle timeout now running (one at a time).
    private var timer: LazyTimer?
    private var context: ChannelHandlerContext?
    private var closeAfterResponse = false
    /// The head timer of a new connection has been started.
    private var opened = false

    init(headerReadTimeout: TimeAmount, bodyReadTimeout: TimeAmount = .seconds(60), idleTimeout: TimeAmount, logger: Logger) {
        self.headerReadTimeout = headerReadTimeout
        self.bodyReadTimeout = bodyReadTimeout
        self.idleTimeout = idleTimeout
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let timer = LazyTimer(eventLoop: context.eventLoop)
        timer.onExpiry = { [weak self] in
            guard let self, let context = self.context else { return }
            self.perform(self.state.timerFired(), context: context)
        }
        self.timer = timer
        if context.channel.isActive { perform(state.opened(), context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.stop()
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        if !opened, state.phase == .readingHead { perform(state.opened(), context: context) }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.stop()
        context.fireChannelInactive()
    }

    /// Called by `EdgeByteObserver` (in front of the codec) when bytes arrive.
    func bytesArrived() {
        guard let context else { return }
        perform(state.bytesArrived(), context: context)
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        switch part {
        case .head(let head):
            let framing = Self.framing(of: head)
            let refusal = framing.refusal.map { (problem: $0, instance: Self.instance(head.uri)) }
            perform(state.headArrived(expectsContinue: framing.expectsContinue, refusal: refusal), context: context)
            guard refusal == nil, state.forwardsInbound else { return }
        case .body:
            guard state.forwardsInbound else { return }
            perform(state.bodyPartArrived(), context: context)
        case .end:
            guard state.forwardsInbound else { return }
            perform(state.requestEnded(), context: context)
        }
        context.fireChannelRead(data)
    }

    /// A request NIO's parser refuses (bad bytes in a head, broken chunked framing) is answered
    /// 400 in its turn: after the answers to the requests before it, never in their place. A
    /// parse error within a body in flight goes on, so that its reader fails (a 400 too).
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if case .dataReceivedInErrorState = error as? ByteToMessageDecoderError, !state.forwardsInbound {
            return  // bytes after a parse error already being answered: nothing more to say
        }
        guard error is HTTPParserError, !state.readingBody else { return context.fireErrorCaught(error) }
        let problem = GatehouseProblem.badRequest("The request is not valid HTTP/1.1.")
        perform(state.headArrived(expectsContinue: false, refusal: (problem: problem, instance: "/")), context: context)
    }

    // MARK: Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(var head) where head.status.code >= 200:
            if state.finalHeadWritten() {
                // The app may or may not send the body it announced: this connection cannot be reused.
                closeAfterResponse = true
                head.headers.replaceOrAdd(name: "Connection", value: "close")
                context.write(wrapOutboundOut(.head(head)), promise: promise)
                return
            }
            context.write(data, promise: promise)
        case .head, .body:
            context.write(data, promise: promise)
        case .end:
            if closeAfterResponse {
                // Closed once the answer is out, never before (its last bytes would be lost).
                let written = context.eventLoop.makePromise(of: Void.self)
                if let promise { written.futureResult.cascade(to: promise) }
                context.writeAndFlush(data, promise: written)
                written.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
                return
            }
            context.write(data, promise: promise)
            perform(state.responseEnded(), context: context)
        }
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is SendContinue else { return context.triggerUserOutboundEvent(event, promise: promise) }
        if state.continueRequested() {
            let head = HTTPResponseHead(version: .http1_1, status: .continue)
            context.writeAndFlush(wrapOutboundOut(.head(head)), promise: promise)
            timer?.arm(in: bodyReadTimeout)
        } else {
            promise?.succeed()
        }
    }

    // MARK: Carrying out the state machine's actions

    private func perform(_ action: ConnectionEdgeStateMachine.Action, context: ChannelHandlerContext) {
        switch action {
        case .none:
            break
        case .armHeaderTimer:
            opened = true
            timer?.arm(in: headerReadTimeout)
        case .armIdleTimer:
            timer?.arm(in: idleTimeout)
        case .armBodyTimer:
            timer?.arm(in: bodyReadTimeout)
        case .cancelTimer:
            timer?.disarm()
        case .close:
            timer?.disarm()
            context.close(promise: nil)
        case .answerAndClose(let problem, let instance):
            timer?.disarm()
            logger.info("request refused at the edge", metadata: ["code": .string(problem.code), "status": .stringConvertible(problem.status)])
            let (head, body) = ProblemBody.responseParts(problem, instance: instance, requestID: RequestIDGenerator.shared.next(),
                                                         closing: true)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }

    // MARK: Framing (RFC 9112)

    /// A connection-level refusal of `head` (`nil` when it may go on), and whether it waits
    /// for `100 Continue`. One pass over the fields; nothing allocated for a plain request.
    static func framing(of head: HTTPRequestHead) -> (refusal: GatehouseProblem?, expectsContinue: Bool) {
        var hosts = 0
        var transferEncoding: [String] = []
        var expect: [String] = []
        for (name, value) in head.headers {
            if RelayHeaderPolicy.isNamed(name, "host") {
                hosts += 1
            } else if RelayHeaderPolicy.isNamed(name, "transfer-encoding") {
                transferEncoding.append(value)
            } else if RelayHeaderPolicy.isNamed(name, "expect") {
                expect.append(value)
            }
        }
        if head.version == .http1_1 ? hosts != 1 : hosts > 1 {
            return (.badRequest("An HTTP/1.1 request needs exactly one Host header."), false)
        }
        if case .failure(let problem) = RequestFraming.isChunked(transferEncoding: transferEncoding) { return (problem, false) }
        switch RequestFraming.expectsContinue(expect: expect, isHTTP11: head.version == .http1_1) {
        case .failure(let problem): return (problem, false)
        case .success(let expects): return (nil, expects)
        }
    }

    private static func instance(_ uri: String) -> String {
        String(uri.prefix { $0 != "?" }.prefix(2048))
    }
}

/// First in each client connection's pipeline: counts the connection against the process's
/// limit (beyond it the connection is answered 503 and closed before any other handler sees
/// a byte) and tells the edge when bytes arrive, so the head timer starts with the first byte.
final class EdgeByteObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let edge: ConnectionEdgeHandler
    private let limiter: ConnectionLimiter
    private var counted = false
    private var refused = false

    init(edge: ConnectionEdgeHandler, limiter: ConnectionLimiter) {
        self.edge = edge
        self.limiter = limiter
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { admit(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        admit(context: context)
        if !refused { context.fireChannelActive() }
    }

    private func admit(context: ChannelHandlerContext) {
        guard !counted, !refused else { return }
        if limiter.open() {
            counted = true
            return
        }
        refused = true
        let body = JSONCoding.encode(ProblemBody(.overCapacity(), instance: "/"))
        var buffer = context.channel.allocator.buffer(capacity: 256 + body.count)
        buffer.writeString("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\nCache-Control: no-store\r\n"
                           + "Retry-After: 1\r\nConnection: close\r\nContent-Length: \(body.count)\r\n\r\n")
        buffer.writeBytes(body)
        // This handler is first in the pipeline: the bytes go straight to the socket.
        context.writeAndFlush(NIOAny(buffer)).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !refused else { return }
        edge.bytesArrived()
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if counted {
            counted = false
            limiter.close()
        }
        context.fireChannelInactive()
    }
}

/// The process's open client connections, against `server.max_connections`.
final class ConnectionLimiter: Sendable {
    let maximum: Int
    private let count = Atomic<Int>(0)

    init(maximum: Int) {
        self.maximum = maximum
    }

    /// Counts a new connection; `false` (and not counted) when the limit is reached.
    func open() -> Bool {
        let now = count.wrappingAdd(1, ordering: .relaxed).newValue
        if now > maximum {
            count.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    func close() {
        count.wrappingSubtract(1, ordering: .relaxed)
    }
}

/// Added by Hummingbird with the other per-connection handlers (after its HTTP-types codec);
/// puts the edge where it sees every request: the byte observer first in the pipeline, the
/// edge right after NIO's HTTP/1.1 codec, then the relay's fast path (when routes exist),
/// all in front of the conversion to HTTP types.
final class EdgeInstaller: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = Never
    private let makeEdge: () -> ConnectionEdgeHandler
    private let limiter: ConnectionLimiter
    private let makeFastPath: (() -> FastRelayHandler)?

    private let logger: Logger

    init(limiter: ConnectionLimiter, logger: Logger, edge: @escaping () -> ConnectionEdgeHandler, fastPath: (() -> FastRelayHandler)?) {
        self.limiter = limiter
        self.logger = logger
        self.makeEdge = edge
        self.makeFastPath = fastPath
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let operations = context.pipeline.syncOperations
        do {
            let codec = try operations.handler(type: HTTP1ToHTTPServerCodec.self)
            let edge = makeEdge()
            try operations.addHandler(EdgeByteObserver(edge: edge, limiter: limiter), position: .first)
            try operations.addHandler(edge, position: .before(codec))
            if let makeFastPath { try operations.addHandler(makeFastPath(), position: .before(codec)) }
            operations.removeHandler(context: context, promise: nil)
        } catch {
            // Without its edge a connection has no timeouts, limit or framing checks: refuse it.
            logger.critical("cannot install the connection edge; closing the connection",
                            metadata: ["error_type": .string(String(describing: type(of: error)))])
            context.close(promise: nil)
        }
    }
}
