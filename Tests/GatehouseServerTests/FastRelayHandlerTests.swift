import GatehouseCore
import GatehouseRelay
@testable import GatehouseServer
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The fast path's handler driven through `EmbeddedChannel`s: one for the app's connection,
/// one per backend connection, with a planner that sends `/fast/…` the fast way and a
/// connector whose connections the test hands out when it chooses.
struct FastRelayHandlerTests {
    struct Planner: FastRelayPlanning {
        func plan(_ request: HTTPRequestHead, remoteAddress: String?) -> FastRelayPlan? {
            guard request.uri.hasPrefix("/fast/") else { return nil }
            let route = RouteSettings(prefix: "/fast", backend: "http://backend.test/b", upstream: "u", timeout: .seconds(1))
            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/b" + request.uri.dropFirst(5), headers: ["Host": "backend.test"])
            return FastRelayPlan(route: route, backend: RouteBackend(url: route.backend)!, head: head, requestID: "rid-" + request.uri,
                                 clientRequestID: nil, isHead: false, path: request.uri)
        }
    }

    /// Hands out connections only when the test says so (`pending`), never from an idle pool.
    final class Connector: BackendConnecting, @unchecked Sendable {
        var pending: [EventLoopPromise<(BackendConnection, reused: Bool)>] = []
        func idleConnection(to backend: RouteBackend, on eventLoop: any EventLoop) -> BackendConnection? { nil }
        func connection(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<(BackendConnection, reused: Bool)> {
            let promise = eventLoop.makePromise(of: (BackendConnection, reused: Bool).self)
            pending.append(promise)
            return promise.futureResult
        }
        func connect(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection> {
            connection(to: backend, on: eventLoop).map { $0.0 }
        }
    }

    struct Harness {
        let app: EmbeddedChannel
        let connector: Connector

        init() throws {
            connector = Connector()
            app = EmbeddedChannel()
            try app.pipeline.syncOperations.addHandler(FastRelayHandler(planner: Planner(), pool: connector, logger: Logger(label: "test")))
            try app.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        }

        /// A backend connection: an `EmbeddedChannel` ending in the fast path's exchange handler.
        func backend() throws -> (EmbeddedChannel, BackendConnection) {
            let channel = EmbeddedChannel()
            let handler = BackendExchangeHandler(pool: LoopPool(eventLoop: channel.embeddedEventLoop, maximumIdle: 4), key: "backend.test:80")
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
            return (channel, BackendConnection(channel: channel, handler: handler))
        }

        /// Hands the oldest connect the fast path is waiting for a new backend connection, and
        /// returns it with the target of the request sent on it (`nil` when none was sent).
        func connectNext(sourceLocation: SourceLocation = #_sourceLocation) throws -> (backend: EmbeddedChannel, sent: String?) {
            try #require(!connector.pending.isEmpty, "the fast path asked for no connection", sourceLocation: sourceLocation)
            let (channel, connection) = try backend()
            connector.pending.removeFirst().succeed((connection, reused: false))
            guard case .head(let head) = try channel.readOutbound(as: HTTPClientRequestPart.self) else { return (channel, nil) }
            return (channel, head.uri)
        }

        func request(_ uri: String) throws {
            try app.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: uri, headers: ["Host": "g"])))
            try app.writeInbound(HTTPServerRequestPart.end(nil))
        }

        /// Answers the backend's request on `channel` with `status` and `body`.
        func answer(_ channel: EmbeddedChannel, status: HTTPResponseStatus = .ok, body: String) throws {
            try channel.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: status,
                                                                                  headers: ["Content-Length": String(body.utf8.count)])))
            try channel.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: body)))
            try channel.writeInbound(HTTPClientResponsePart.end(nil))
        }

        /// Every response part written to the app so far: statuses, bodies, ends.
        func written() throws -> [String] {
            var parts: [String] = []
            while let part = try app.readOutbound(as: HTTPServerResponsePart.self) {
                switch part {
                case .head(let head): parts.append("head \(head.status.code) \(head.headers.first(name: "x-request-id") ?? "")")
                case .body(.byteBuffer(let buffer)): parts.append("body " + String(buffer: buffer))
                case .body: parts.append("body ?")
                case .end: parts.append("end")
                }
            }
            return parts
        }

        /// The request parts the fast path passed on to Hummingbird.
        func passedOn() throws -> [String] {
            var parts: [String] = []
            while let part = try app.readInbound(as: HTTPServerRequestPart.self) {
                switch part {
                case .head(let head): parts.append("head " + head.uri)
                case .body: parts.append("body")
                case .end: parts.append("end")
                }
            }
            return parts
        }
    }

    @Test func aFastRequestIsRelayedOnABackendConnection() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        #expect(try harness.passedOn().isEmpty)
        let (backend, sent) = try harness.connectNext()
        #expect(sent == "/b/1", "no head sent")
        try harness.answer(backend, body: "one")
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body one", "end"])
        let handler = try harness.app.pipeline.syncOperations.handler(type: FastRelayHandler.self)
        guard case .idle = handler.state else { Issue.record("exchange not finished"); return }
    }

    /// Pipelining: requests behind a fast one wait; a fast one behind a general one waits for
    /// Hummingbird's answer (and so goes the general way); answers keep request order.
    @Test func pipelinedRequestsKeepTheirOrder() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        try harness.request("/general")
        try harness.request("/fast/2")
        #expect(try harness.passedOn().isEmpty)  // queued behind the fast exchange
        let (backend, _) = try harness.connectNext()
        try harness.answer(backend, body: "one")
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body one", "end"])
        // Hummingbird now owes /general, so /fast/2 goes to it too rather than overtaking.
        #expect(try harness.passedOn() == ["head /general", "end", "head /fast/2", "end"])
        #expect(harness.connector.pending.isEmpty)
        try harness.app.writeOutbound(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .accepted)))
        try harness.app.writeOutbound(HTTPServerResponsePart.end(nil))
        #expect(try harness.written() == ["head 202 ", "end"])
    }

    /// An exchange started from the queue still has its `.end` queued: a request arriving
    /// meanwhile is queued behind it, never swallowed as that exchange's remainder.
    @Test func aRequestArrivingDuringAQueuedExchangeIsAnswered() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        try harness.request("/fast/2")
        let (backend1, _) = try harness.connectNext()
        try harness.answer(backend1, body: "one")
        // /fast/2 now runs, started from the queue; /fast/3 arrives from the network.
        try harness.request("/fast/3")
        let (backend2, _) = try harness.connectNext()
        try harness.answer(backend2, body: "two")
        let (backend3, sent) = try harness.connectNext()
        #expect(sent == "/b/3", "/fast/3 was lost")
        try harness.answer(backend3, body: "three")
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body one", "end", "head 200 rid-/fast/2", "body two", "end",
                                          "head 200 rid-/fast/3", "body three", "end"])
    }

    /// A backend that closes mid-answer: the app's connection cannot be saved and is closed.
    @Test func aBackendClosingMidResponseClosesTheAppConnection() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        let (backend, _) = try harness.connectNext()
        try backend.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: ["Content-Length": "100"])))
        try backend.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: "partial")))
        #expect(harness.app.isActive)
        _ = try? backend.close().wait()
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body partial"])
        #expect(!harness.app.isActive)
    }

    /// No answer within the route's timeout: 504 problem, and the exchange is over.
    @Test func aSilentBackendIsA504() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        let (backend, _) = try harness.connectNext()
        harness.app.embeddedEventLoop.advanceTime(by: .seconds(2))
        let written = try harness.written()
        #expect(written.first == "head 504 rid-/fast/1")
        #expect(written.last == "end")
        #expect(!backend.isActive)  // a connection that may still answer is never reused
        #expect(harness.app.isActive)
    }

    /// A connection that arrives after its exchange timed out is given back untouched and
    /// never answers a later request.
    @Test func aLateConnectCallbackNeverTouchesALaterExchange() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        harness.app.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(try harness.written().first == "head 504 rid-/fast/1")
        try harness.request("/fast/2")
        let late = harness.connector.pending.removeFirst()
        let (lateBackend, lateConnection) = try harness.backend()
        late.succeed((lateConnection, reused: false))
        #expect(try lateBackend.readOutbound(as: HTTPClientRequestPart.self) == nil)
        #expect(try harness.written().isEmpty)
        let (backend, sent) = try harness.connectNext()
        #expect(sent == "/b/2", "no head sent")
        try harness.answer(backend, body: "two")
        #expect(try harness.written() == ["head 200 rid-/fast/2", "body two", "end"])
    }
}
