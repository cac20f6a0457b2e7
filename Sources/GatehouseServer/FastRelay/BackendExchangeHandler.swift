import NIOCore
import NIOHTTP1

/// What a relayed exchange is told about the backend's answer (all on the event loop).
protocol BackendExchangeDelegate: AnyObject {
    func backendResponseHead(_ head: HTTPResponseHead)
    func backendResponseBody(_ buffer: ByteBuffer)
    func backendResponseEnd(reusable: Bool)
    /// A batch of reads is over: time to flush what was written to the app.
    func backendReadComplete()
    func backendFailed(_ error: any Error, beforeHead: Bool)
}

/// The last handler of a backend connection: sends one request at a time and hands the
/// answer to the exchange that sent it.
final class BackendExchangeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    private let pool: LoopPool
    private let key: String
    private weak var delegate: (any BackendExchangeDelegate)?
    private var context: ChannelHandlerContext?
    private var sawHead = false
    private var keepAlive = true

    init(pool: LoopPool, key: String) {
        self.pool = pool
        self.key = key
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    /// Sends `head` and `body` (whole, or none) and reports the answer to `delegate`.
    func send(_ head: HTTPRequestHead, body: ByteBuffer?, delegate: any BackendExchangeDelegate) {
        guard let context else { return delegate.backendFailed(ChannelError.ioOnClosedChannel, beforeHead: true) }
        self.delegate = delegate
        sawHead = false
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if let body, body.readableBytes > 0 { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    /// Gives the connection back to its loop's pool, or closes it.
    func release(reusable: Bool) {
        delegate = nil
        guard let context else { return }
        if reusable {
            pool.giveBack(BackendConnection(channel: context.channel, handler: self), key: key)
        } else {
            context.close(promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            sawHead = true
            keepAlive = head.isKeepAlive
            delegate?.backendResponseHead(head)
        case .body(let buffer):
            delegate?.backendResponseBody(buffer)
        case .end:
            let delegate = self.delegate
            self.delegate = nil
            delegate?.backendResponseEnd(reusable: keepAlive)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        delegate?.backendReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        pool.forget(context.channel, key: key)
        fail(ChannelError.eof)
        context.fireChannelInactive()
    }

    private func fail(_ error: any Error) {
        let delegate = self.delegate
        self.delegate = nil
        delegate?.backendFailed(error, beforeHead: !sawHead)
    }
}
