import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseUpstreams
@testable import GatehouseServer
@testable import GatehouseSessions
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
        static let route = RouteSettings(prefix: "/fast", backend: "http://backend.test/b", upstream: "u", timeout: .seconds(1))
        static let target = FastRoute(route: route, backend: RouteBackend(url: route.backend)!,
                                      policy: RelayHeaderPolicy(route: route, allIdentityHeaders: []), tls: nil, sessionOnly: false)

        func plan(_ request: HTTPRequestHead, remoteAddress: String?, memo: inout ConnectionMemo) -> FastRelayPlan? {
            guard request.uri.hasPrefix("/fast/") else { return nil }
            let length = request.headers.first(name: "content-length").flatMap(Int.init) ?? 0
            var headers: HTTPHeaders = ["Host": "backend.test"]
            if length > 0 { headers.add(name: "Content-Length", value: String(length)) }
            let head = HTTPRequestHead(version: .http1_1, method: request.method, uri: "/b" + request.uri.dropFirst(5), headers: headers)
            return FastRelayPlan(target: Self.target, head: head, requestID: "rid-" + request.uri,
                                 clientRequestID: nil, isHead: request.method == .HEAD, bodyLength: length, path: request.uri)
        }
    }

    /// Hands out connections only when the test says so (`pending`), never from an idle pool.
    final class Connector: BackendConnecting, @unchecked Sendable {
        var pending: [EventLoopPromise<BackendConnection>] = []
        /// Handed out once as a pooled connection, when set.
        var idle: BackendConnection?
        func idleConnection(to target: FastRoute, on eventLoop: any EventLoop, idleAtMost: TimeAmount) -> BackendConnection? {
            defer { idle = nil }
            return idle
        }
        func connect(to target: FastRoute, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection> {
            let promise = eventLoop.makePromise(of: BackendConnection.self)
            pending.append(promise)
            return promise.futureResult
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
            let handler = BackendExchangeHandler(pool: LoopPool(eventLoop: channel.embeddedEventLoop, maximumIdle: 4, idleTimeout: .seconds(30)), key: "backend.test:80")
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
            return (channel, BackendConnection(channel: channel, handler: handler))
        }

        /// Hands the oldest connect the fast path is waiting for a new backend connection, and
        /// returns it with the target of the request sent on it (`nil` when none was sent).
        func connectNext(sourceLocation: SourceLocation = #_sourceLocation) throws -> (backend: EmbeddedChannel, sent: String?) {
            try #require(!connector.pending.isEmpty, "the fast path asked for no connection", sourceLocation: sourceLocation)
            let (channel, connection) = try backend()
            connector.pending.removeFirst().succeed(connection)
            guard case .head(let head) = try channel.readOutbound(as: HTTPClientRequestPart.self) else { return (channel, nil) }
            return (channel, head.uri)
        }

        func post(_ uri: String, body parts: [String], method: HTTPMethod = .POST) throws {
            let length = parts.reduce(0) { $0 + $1.utf8.count }
            try app.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: method, uri: uri,
                                                                            headers: ["Host": "g", "Content-Length": String(length)])))
            for part in parts { try app.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: part))) }
            try app.writeInbound(HTTPServerRequestPart.end(nil))
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
        late.succeed(lateConnection)
        #expect(try lateBackend.readOutbound(as: HTTPClientRequestPart.self) == nil)
        #expect(try harness.written().isEmpty)
        let (backend, sent) = try harness.connectNext()
        #expect(sent == "/b/2", "no head sent")
        try harness.answer(backend, body: "two")
        #expect(try harness.written() == ["head 200 rid-/fast/2", "body two", "end"])
    }

    /// A body is read whole before any backend connection is asked for, then sent in one go.
    @Test func aBodyIsReadWholeBeforeTheBackendIsAsked() throws {
        let harness = try Harness()
        try harness.app.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/fast/p",
                                                                                headers: ["Host": "g", "Content-Length": "6"])))
        try harness.app.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "abc")))
        #expect(harness.connector.pending.isEmpty, "a backend was asked for before the body was complete")
        try harness.app.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "def")))
        try harness.app.writeInbound(HTTPServerRequestPart.end(nil))
        #expect(try harness.passedOn().isEmpty)
        let (backend, sent) = try harness.connectNext()
        #expect(sent == "/b/p")
        guard case .body(.byteBuffer(let body)) = try backend.readOutbound(as: HTTPClientRequestPart.self) else {
            Issue.record("no body sent")
            return
        }
        #expect(String(buffer: body) == "abcdef")
        guard case .end = try backend.readOutbound(as: HTTPClientRequestPart.self) else { Issue.record("no end sent"); return }
        try harness.answer(backend, body: "ok")
        #expect(try harness.written() == ["head 200 rid-/fast/p", "body ok", "end"])
    }

    /// A client that goes away mid-body never causes a backend request.
    @Test func aClientLeavingMidBodyReachesNoBackend() throws {
        let harness = try Harness()
        try harness.app.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/fast/p",
                                                                                headers: ["Host": "g", "Content-Length": "6"])))
        try harness.app.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "abc")))
        _ = try? harness.app.close().wait()
        #expect(harness.connector.pending.isEmpty)
    }

    /// A pooled connection the backend closed before answering: a GET is sent again on a fresh
    /// connection, a POST is answered 502 and never sent twice.
    @Test(arguments: [HTTPMethod.GET, .PUT, .POST, .PATCH])
    func onlyIdempotentRequestsAreSentAgain(method: HTTPMethod) throws {
        let harness = try Harness()
        let (stale, connection) = try harness.backend()
        harness.connector.idle = connection
        if method == .GET { try harness.request("/fast/r") } else { try harness.post("/fast/r", body: ["x"], method: method) }
        guard case .head = try stale.readOutbound(as: HTTPClientRequestPart.self) else { Issue.record("nothing sent"); return }
        _ = try? stale.close().wait()
        let idempotent = method == .GET || method == .PUT
        #expect(harness.connector.pending.count == (idempotent ? 1 : 0))
        if idempotent {
            let (backend, sent) = try harness.connectNext()
            #expect(sent == "/b/r")
            try harness.answer(backend, body: "again")
            #expect(try harness.written() == ["head 200 rid-/fast/r", "body again", "end"])
        } else {
            #expect(try harness.written().first == "head 502 rid-/fast/r")
        }
    }

    /// A client pipelining more parts than the queue behind a fast exchange holds is closed.
    @Test func tooManyPipelinedPartsCloseTheConnection() throws {
        let harness = try Harness()
        try harness.request("/fast/1")
        for index in 0..<(FastRelayHandler.maximumQueuedParts / 2) { try harness.request("/fast/q\(index)") }
        #expect(harness.app.isActive)
        let over = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/fast/over", headers: ["Host": "g"])
        try harness.app.writeInbound(HTTPServerRequestPart.head(over))
        #expect(!harness.app.isActive)
        #expect(try harness.passedOn().isEmpty)
    }

    /// The pool hands out the connection used last, only within the age asked for, and its sweep
    /// closes connections idle past the pool's idle timeout.
    @Test func pooledConnectionsAgeOut() throws {
        let loop = EmbeddedEventLoop()
        let pool = LoopPool(eventLoop: loop, maximumIdle: 4, idleTimeout: .seconds(30))
        func connection() throws -> BackendConnection {
            let channel = EmbeddedChannel(loop: loop)
            let handler = BackendExchangeHandler(pool: pool, key: "k")
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
            return BackendConnection(channel: channel, handler: handler)
        }
        let old = try connection()
        pool.giveBack(old, key: "k")
        loop.advanceTime(by: .seconds(2))
        #expect(pool.takeIdle("k", idleAtMost: .seconds(1)) == nil, "a 2 s idle connection was handed to a POST")
        #expect(pool.takeIdle("k", idleAtMost: .seconds(30))?.channel === old.channel)
        pool.giveBack(old, key: "k")
        loop.advanceTime(by: .seconds(46))
        #expect(!old.channel.isActive, "the sweep left a connection idle for 46 s open")
        #expect(pool.takeIdle("k", idleAtMost: .seconds(60)) == nil)
    }
}

/// The fast path's per-connection copy of a sealed session view never outlives what the
/// session cache would say: a revocation or a refresh elsewhere, or the entry's end of life.
struct SealedMemoTests {
    static func view(session: String, accessToken: String) throws -> SessionServices.SessionView {
        let tokens = try UpstreamTokenResponse(body: Data(#"{"access_token":"\#(accessToken)","token_type":"Bearer"}"#.utf8))
        return SessionServices.SessionView(sessionID: session, upstream: "legacy", clientID: "app", version: 1, tokens: tokens,
                                           upstreamExpiresAt: nil)
    }

    @Test func aCopiedViewIsDroppedWithItsSession() throws {
        let cache = SessionViewCache()
        let now = Date()
        cache.put(SecureToken.hash("gha_one"), try Self.view(session: "s1", accessToken: "up-1"), until: now.addingTimeInterval(10), now: now)
        var memo: SealedMemo?
        #expect(SealedMemo.view(of: "gha_one", in: cache, now: now, memo: &memo)?.sessionID == "s1")
        #expect(memo?.token == "gha_one")
        // Revoked on this instance (or announced by another): the copy must not answer again.
        cache.dropSession("s1", now: now)
        #expect(SealedMemo.view(of: "gha_one", in: cache, now: now, memo: &memo) == nil, "a revoked session was relayed from the memo")
        #expect(memo == nil)
    }

    @Test func aReplacedViewIsReadAgain() throws {
        let cache = SessionViewCache()
        let now = Date()
        let hash = SecureToken.hash("gha_two")
        cache.put(hash, try Self.view(session: "s2", accessToken: "up-old"), until: now.addingTimeInterval(10), now: now)
        var memo: SealedMemo?
        _ = SealedMemo.view(of: "gha_two", in: cache, now: now, memo: &memo)
        // A refresh stores the session's new upstream token under the same Gatehouse token.
        cache.put(hash, try Self.view(session: "s2", accessToken: "up-new"), until: now.addingTimeInterval(10), now: now)
        #expect(SealedMemo.view(of: "gha_two", in: cache, now: now, memo: &memo)?.tokens.accessToken.reveal() == "up-new")
    }

    @Test func aCopyLivesNoLongerThanItsEntryAndServesOnlyItsToken() throws {
        let cache = SessionViewCache()
        let now = Date()
        cache.put(SecureToken.hash("gha_three"), try Self.view(session: "s3", accessToken: "up-3"), until: now.addingTimeInterval(10), now: now)
        var memo: SealedMemo?
        _ = SealedMemo.view(of: "gha_three", in: cache, now: now, memo: &memo)
        #expect(SealedMemo.view(of: "gha_other", in: cache, now: now, memo: &memo) == nil, "another token was answered from the memo")
        _ = SealedMemo.view(of: "gha_three", in: cache, now: now, memo: &memo)
        #expect(SealedMemo.view(of: "gha_three", in: cache, now: now.addingTimeInterval(11), memo: &memo) == nil)
    }
}
