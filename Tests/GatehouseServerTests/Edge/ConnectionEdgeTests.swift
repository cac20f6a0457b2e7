import GatehouseCore
@testable import GatehouseServer
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The connection's edge: its state machine alone, then the handler through `EmbeddedChannel`.
struct ConnectionEdgeTests {
    @Test func aNewConnectionOwesAHeadThenIdlesBetweenRequests() {
        var machine = ConnectionEdgeStateMachine()
        do { let action = machine.opened(); #expect(action == .armHeaderTimer) }
        do { let action = machine.headArrived(expectsContinue: false, refusal: nil); #expect(action == .armBodyTimer) }
        do { let action = machine.requestEnded(); #expect(action == .cancelTimer) }
        do { let action = machine.timerFired(); #expect(action == .none) }  // an answer in the making is the route's business
        do { let action = machine.responseEnded(); #expect(action == .armIdleTimer) }
        do { let action = machine.bytesArrived(); #expect(action == .armHeaderTimer) }
        do { let action = machine.bytesArrived(); #expect(action == .none) }  // a slow head does not restart its timer
        do { let action = machine.timerFired(); #expect(action == .close) }
    }

    @Test func aStalledBodyClosesButOneAwaitingContinueDoesNot() {
        var machine = ConnectionEdgeStateMachine()
        _ = machine.opened()
        _ = machine.headArrived(expectsContinue: false, refusal: nil)
        do { let action = machine.bodyPartArrived(); #expect(action == .armBodyTimer) }
        do { let action = machine.timerFired(); #expect(action == .close) }

        var waiting = ConnectionEdgeStateMachine()
        _ = waiting.opened()
        do { let action = waiting.headArrived(expectsContinue: true, refusal: nil); #expect(action == .cancelTimer) }
        do { let action = waiting.timerFired(); #expect(action == .none) }  // the app waits for Gatehouse
    }

    @Test func aRefusalWaitsForEarlierAnswersThenCloses() {
        var machine = ConnectionEdgeStateMachine()
        _ = machine.opened()
        _ = machine.headArrived(expectsContinue: false, refusal: nil)
        do { let action = machine.headArrived(expectsContinue: false, refusal: (.expectationFailed(), "/x")); #expect(action == .cancelTimer) }
        #expect(!machine.forwardsInbound)
        do { let action = machine.headArrived(expectsContinue: false, refusal: nil); #expect(action == .none) }
        do { let action = machine.responseEnded(); #expect(action == .answerAndClose(.expectationFailed(), instance: "/x")) }
    }

    @Test func continueIsSentOnceAndAFinalAnswerWithoutItCloses() {
        var machine = ConnectionEdgeStateMachine()
        _ = machine.opened()
        _ = machine.headArrived(expectsContinue: true, refusal: nil)
        do { let answer = machine.continueRequested(); #expect(answer) }
        do { let answer = machine.continueRequested(); #expect(!answer) }
        do { let answer = machine.finalHeadWritten(); #expect(!answer) }

        var refused = ConnectionEdgeStateMachine()
        _ = refused.opened()
        _ = refused.headArrived(expectsContinue: true, refusal: nil)
        do { let answer = refused.finalHeadWritten(); #expect(answer) }  // 401 before 100: the body may or may not follow
    }

    static func channel(headerTimeout: TimeAmount = .seconds(5), idleTimeout: TimeAmount = .seconds(10)) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            ConnectionEdgeHandler(headerReadTimeout: headerTimeout, idleTimeout: idleTimeout, logger: Logger(label: "test")))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    static func status(_ channel: EmbeddedChannel) throws -> UInt? {
        guard case .head(let head) = try channel.readOutbound(as: HTTPServerResponsePart.self) else { return nil }
        return head.status.code
    }

    @Test func framingRefusalsAreAnsweredAndClosed() throws {
        let cases: [(HTTPHeaders, UInt)] = [
            (HTTPHeaders(), 400), (HTTPHeaders([("Host", "a"), ("Host", "b")]), 400),
            (HTTPHeaders([("Host", "a"), ("Transfer-Encoding", "gzip, chunked")]), 501),
            (HTTPHeaders([("Host", "a"), ("Transfer-Encoding", "chunked, gzip")]), 400),
            (HTTPHeaders([("Host", "a"), ("Expect", "teapot")]), 417),
        ]
        for (headers, status) in cases {
            let channel = try Self.channel()
            try channel.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/api/x", headers: headers)))
            #expect(try channel.readInbound(as: HTTPServerRequestPart.self) == nil)  // never reaches the relay
            #expect(try Self.status(channel) == status, "\(headers)")
            #expect(!channel.isActive)
        }
    }

    @Test func silentAndIdleConnectionsAreClosedOnTime() throws {
        let silent = try Self.channel(headerTimeout: .seconds(5))
        silent.embeddedEventLoop.advanceTime(by: .seconds(4))
        #expect(silent.isActive)
        silent.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!silent.isActive)

        let idle = try Self.channel(headerTimeout: .seconds(5), idleTimeout: .seconds(10))
        try idle.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/", headers: ["Host": "a"])))
        try idle.writeInbound(HTTPServerRequestPart.end(nil))
        idle.embeddedEventLoop.advanceTime(by: .seconds(600))
        #expect(idle.isActive)  // a request read whole has no edge timer while it is answered
        try idle.writeOutbound(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok)))
        try idle.writeOutbound(HTTPServerResponsePart.end(nil))
        idle.embeddedEventLoop.advanceTime(by: .seconds(9))
        #expect(idle.isActive)
        idle.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!idle.isActive)
    }
}

extension ConnectionEdgeTests {
    @Test func aBodyThatStopsArrivingIsClosedAfterTheBodyTimeout() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ConnectionEdgeHandler(
            headerReadTimeout: .seconds(5), bodyReadTimeout: .seconds(3), idleTimeout: .seconds(10), logger: Logger(label: "test")))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try channel.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(
            version: .http1_1, method: .POST, uri: "/api/x", headers: ["Host": "a", "Content-Length": "100"])))
        try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "x")))
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "y")))
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(channel.isActive)  // each part starts the timer again
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!channel.isActive)
    }
}
