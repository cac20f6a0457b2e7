public import Hummingbird
import NIOCore

/// The request context of every Gatehouse route: the caller's address (for `Forwarded`)
/// and the request id (for logs and for the backend).
public struct GatehouseRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The peer's IP address; `nil` when the transport has none (in-process tests).
    public let remoteAddress: String?
    public var requestID: String = ""

    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.remoteAddress = source.channel.remoteAddress?.ipAddress
    }
}
