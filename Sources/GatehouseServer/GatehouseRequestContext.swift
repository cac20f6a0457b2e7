public import Hummingbird
import NIOCore

/// The request context of every Gatehouse route: the caller's address (for `Forwarded`)
/// and the request id (for logs and for the backend).
public struct GatehouseRequestContext: RequestContext {
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
    func sendContinue() async {
        try? await channel.triggerUserOutboundEvent(SendContinue()).get()
    }
}
