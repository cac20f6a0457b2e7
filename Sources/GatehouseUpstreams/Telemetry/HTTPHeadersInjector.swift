public import Tracing
public import NIOHTTP1

/// Writes a trace context (W3C `traceparent`, `tracestate`) into an outgoing request's headers,
/// replacing any value of the same name.
public struct HTTPHeadersInjector: Injector {
    public init() {}

    public func inject(_ value: String, forKey key: String, into headers: inout HTTPHeaders) {
        headers.replaceOrAdd(name: key, value: value)
    }
}
