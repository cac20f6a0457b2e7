public import Hummingbird
import NIOCore

/// What Gatehouse's middlewares and relay read of a request context: the caller's address (for
/// the rate limits and `Forwarded`), the request ids (for logs and for the backend), and a way to
/// ask for `100 Continue`. The middlewares are generic over it, in Hummingbird's style, so a router
/// of another context that provides these can use them.
public protocol GatehouseRequestContextProtocol: RequestContext {
    /// The peer's IP address; `nil` when the transport has none (in-process tests).
    var remoteAddress: String? { get }
    var requestID: String { get set }
    /// The client's own `X-Request-Id`, when plain: relayed as `X-Client-Request-Id`, logged.
    var clientRequestID: String? { get set }
    /// Asks for `100 Continue` when the request expects it (RFC 9110 §10.1.1), before its body is read.
    func sendContinue() async
}

/// The request context of every Gatehouse route.
public struct GatehouseRequestContext: GatehouseRequestContextProtocol {
    public var coreContext: CoreRequestContextStorage
    /// The peer's IP address; `nil` when the transport has none (in-process tests).
    public let remoteAddress: String?
    public var requestID: String = ""
    /// The client's own `X-Request-Id`, when plain: relayed as `X-Client-Request-Id`, logged.
    public var clientRequestID: String?
    /// The client connection, for `100 Continue` (sent by the connection's edge).
    let channel: any Channel

    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.remoteAddress = source.channel.remoteAddress?.ipAddress
        self.channel = source.channel
    }

    /// Asks for `100 Continue` when the request expects it (RFC 9110 §10.1.1), before its body is read.
    public func sendContinue() async {
        try? await channel.triggerUserOutboundEvent(SendContinue()).get()
    }
}
