import GatehouseCore
import GatehouseRelay
@testable import GatehouseServer
@testable import GatehouseStore
import HTTPTypes
import Metrics
import MetricsTestKit
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The labels of request metrics and spans: few values, never a raw path.
struct TelemetryTests {
    static let endpoints: [String: [HTTPRequest.Method]] = ["/oauth/token": [.post], "/healthz": [.get], "/auth/refresh": [.post]]

    static func route(_ prefix: String) -> RouteSettings {
        RouteSettings(prefix: prefix, backend: "http://backend.test/b", upstream: "u", timeout: .seconds(1))
    }

    @Test func ownEndpointsAreLabelledWithTheirPath() {
        for path in Self.endpoints.keys {
            #expect(RouteLabel.of(path: path, endpoints: Self.endpoints, relayed: nil) == path)
        }
    }

    @Test func relayedRequestsAreLabelledWithTheirRoutePrefix() {
        #expect(RouteLabel.of(path: "/api/users/42", endpoints: Self.endpoints, relayed: Self.route("/api")) == "/api/*")
        #expect(RouteLabel.of(path: "/api", endpoints: Self.endpoints, relayed: Self.route("/api")) == "/api/*")
        #expect(RouteLabel.of(path: "/files/a", endpoints: Self.endpoints, relayed: Self.route("/files/")) == "/files/*")
    }

    /// Whatever a client asks for outside the known paths is one label, never its path.
    @Test func anythingElseIsUnmatched() {
        for path in ["/", "/oauth/token/extra", "/HEALTHZ", "/users/123", "/oauth/token%20", "/x?code=secret", "//x//"] {
            #expect(RouteLabel.of(path: path, endpoints: Self.endpoints, relayed: nil) == RouteLabel.unmatched, "\(path)")
        }
    }

    /// Paths the router serves as an endpoint (doubled or trailing slashes) are labelled as it.
    @Test func theRoutersFormOfAPathIsLabelledAsTheEndpoint() {
        for path in ["/healthz/", "//healthz", "/oauth//token", "//oauth/token/"] {
            #expect(RouteLabel.of(path: path, endpoints: Self.endpoints, relayed: nil) != RouteLabel.unmatched, "\(path)")
        }
        #expect(RouteLabel.routerPath("//oauth//token/") == "/oauth/token")
        #expect(RouteLabel.routerPath("/") == "/")
        #expect(RouteLabel.routerPath("/a/b") == "/a/b")
    }

    @Test func statusClassesAndMethodsHaveFewValues() {
        #expect([100, 200, 204, 302, 404, 429, 503, 599].map(StatusClass.label) == ["1xx", "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "5xx"])
        #expect(StatusClass.label(of: 0) == "1xx")
        #expect(StatusClass.label(of: 999) == "5xx")
        #expect(MethodLabel.of("GET") == "GET")
        #expect(MethodLabel.of("PATCH") == "PATCH")
        #expect(MethodLabel.of("BREW") == "other")
        #expect(MethodLabel.of("get") == "other")
    }

    @Test func theTraceparentIsReadFromTheRequestFields() {
        var fields = HTTPFields()
        fields[HTTPField.Name("traceparent")!] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        #expect(HTTPFieldsExtractor().extract(key: "traceparent", from: fields) == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        #expect(HTTPFieldsExtractor().extract(key: "tracestate", from: fields) == nil)
    }
}

/// What the fast path and the store count, through MetricsTestKit's factory.
struct TelemetryCountTests {
    /// Holds `measure` bodies until the test opens it.
    actor Gate {
        private var waiters: [CheckedContinuation<Void, Never>] = []
        private var isOpen = false

        var waiting: Int { waiters.count }

        func wait() async {
            guard !isOpen else { return }
            await withCheckedContinuation { waiters.append($0) }
        }

        func open() {
            isOpen = true
            for waiter in waiters { waiter.resume() }
            waiters.removeAll()
        }
    }

    /// Three queries on a pool of two: two connections in use, one lease wait, then none in use.
    @Test func theStoreCountsConnectionsInUseAndLeaseWaits() async throws {
        let metrics = TestMetrics()
        let telemetry = StoreTelemetry(store: "postgres", poolSize: 2, factory: metrics)
        let dimensions = [("store", "postgres")]
        let gate = Gate()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<3 { group.addTask { try await telemetry.measure { await gate.wait() } } }
            while await gate.waiting < 3 { await Task.yield() }
            #expect(try metrics.expectMeter(GatehouseMetrics.storeConnectionsInUse, dimensions).lastValue == 2)
            #expect(try metrics.expectCounter(GatehouseMetrics.storeLeaseWaitsTotal, dimensions).totalValue == 1)
            await gate.open()
            try await group.waitForAll()
        }
        #expect(try metrics.expectMeter(GatehouseMetrics.storeConnectionsInUse, dimensions).lastValue == 0)
        #expect(try metrics.expectTimer(GatehouseMetrics.storeQueryDuration, dimensions).values.count == 3)
    }

    /// A failing query is timed and frees its connection too.
    @Test func aFailedQueryIsCountedAndFreesItsConnection() async throws {
        struct Failure: Error {}
        let metrics = TestMetrics()
        let telemetry = StoreTelemetry(store: "sqlite", poolSize: 1, factory: metrics)
        await #expect(throws: Failure.self) { try await telemetry.measure { throw Failure() } }
        #expect(try metrics.expectMeter(GatehouseMetrics.storeConnectionsInUse, [("store", "sqlite")]).lastValue == 0)
        #expect(try metrics.expectTimer(GatehouseMetrics.storeQueryDuration, [("store", "sqlite")]).values.count == 1)
    }

    /// A fast exchange counts as a request of its route (method, status class), is timed, and
    /// counts as relayed on the fast path.
    @Test func aFastExchangeIsCountedLikeARequest() throws {
        let metrics = TestMetrics()
        let route = RelayRouteMetrics(route: "/api/*", methods: ["GET", "HEAD", "POST"], factory: metrics)
        route.record(method: "GET", status: 200, nanoseconds: 1_500_000)
        route.record(method: "GET", status: 504, nanoseconds: 2_000_000)
        route.record(method: "HEAD", status: 404, nanoseconds: 500_000)
        route.record(method: "POST", status: 201, nanoseconds: 700_000)
        func requests(_ method: String, _ statusClass: String) throws -> Int64 {
            try metrics.expectCounter(GatehouseMetrics.requestsTotal,
                                      [("route", "/api/*"), ("method", method), ("status_class", statusClass)]).totalValue
        }
        #expect(try requests("GET", "2xx") == 1)
        #expect(try requests("GET", "5xx") == 1)
        #expect(try requests("HEAD", "4xx") == 1)
        #expect(try requests("GET", "4xx") == 0)
        #expect(try requests("POST", "2xx") == 1, "a fast POST (issue 12) was counted as another method")
        #expect(try requests("GET", "2xx") == 1)
        #expect(try metrics.expectCounter(GatehouseMetrics.relayRequestsTotal, [("route", "/api/*"), ("path", "fast")]).totalValue == 4)
        #expect(try metrics.expectTimer(GatehouseMetrics.requestDuration, [("route", "/api/*")]).values == [1_500_000, 2_000_000, 500_000, 700_000])
    }
}

/// The fast path during a drain: the server's `ChannelShouldQuiesceEvent` waits until the
/// fast exchange (and the requests queued behind it) are answered, so Hummingbird, which
/// never saw them, cannot close the connection under them.
struct FastRelayDrainTests {
    /// Stands for Hummingbird behind the fast path: records the drain, passes requests on.
    final class DrainRecorder: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        private(set) var drains = 0

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.fireChannelRead(data)
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if event is ChannelShouldQuiesceEvent { drains += 1 }
            context.fireUserInboundEventTriggered(event)
        }
    }

    static func harness() throws -> (FastRelayHandlerTests.Harness, DrainRecorder) {
        let harness = try FastRelayHandlerTests.Harness()
        let recorder = DrainRecorder()
        try harness.app.pipeline.syncOperations.addHandler(recorder)
        return (harness, recorder)
    }

    static func drain(_ harness: FastRelayHandlerTests.Harness) {
        harness.app.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        harness.app.embeddedEventLoop.run()
    }

    @Test func withNothingFastInFlightTheDrainGoesOnAtOnce() throws {
        let (harness, recorder) = try Self.harness()
        Self.drain(harness)
        #expect(recorder.drains == 1)
    }

    /// Once draining, a new request goes to Hummingbird (which answers `Connection: close`),
    /// never the fast path (which would keep a pipelining client's connection open to the deadline).
    @Test func afterTheDrainNewRequestsGoTheGeneralWay() throws {
        let (harness, recorder) = try Self.harness()
        Self.drain(harness)
        #expect(recorder.drains == 1)
        try harness.request("/fast/after-drain")
        #expect(try harness.passedOn() == ["head /fast/after-drain", "end"])
    }

    @Test func theDrainWaitsForTheFastAnswerToBeWritten() throws {
        let (harness, recorder) = try Self.harness()
        try harness.request("/fast/1")
        Self.drain(harness)
        #expect(recorder.drains == 0, "the drain reached Hummingbird during a fast exchange")
        let (backend, _) = try harness.connectNext()
        try backend.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok,
                                                                              headers: ["Content-Length": "3"])))
        harness.app.embeddedEventLoop.run()
        #expect(recorder.drains == 0, "the drain reached Hummingbird mid-answer")
        try backend.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: "one")))
        try backend.writeInbound(HTTPClientResponsePart.end(nil))
        harness.app.embeddedEventLoop.run()
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body one", "end"])
        #expect(recorder.drains == 1)
        #expect(harness.app.isActive)  // closing is Hummingbird's decision, once it has the drain
    }

    @Test func requestsQueuedBehindAFastOneAreAnsweredBeforeTheDrainGoesOn() throws {
        let (harness, recorder) = try Self.harness()
        try harness.request("/fast/1")
        try harness.request("/fast/2")
        Self.drain(harness)
        let (backend1, _) = try harness.connectNext()
        try harness.answer(backend1, body: "one")
        harness.app.embeddedEventLoop.run()
        #expect(recorder.drains == 0, "the drain went on with /fast/2 still queued")
        let (backend2, sent) = try harness.connectNext()
        #expect(sent == "/b/2")
        try harness.answer(backend2, body: "two")
        harness.app.embeddedEventLoop.run()
        #expect(try harness.written() == ["head 200 rid-/fast/1", "body one", "end", "head 200 rid-/fast/2", "body two", "end"])
        #expect(recorder.drains == 1)
    }

    /// A general request queued behind the fast one is handed to Hummingbird first, then the
    /// drain: Hummingbird closes after answering it.
    @Test func aGeneralRequestQueuedBehindReachesHummingbirdBeforeTheDrain() throws {
        let (harness, recorder) = try Self.harness()
        try harness.request("/fast/1")
        try harness.request("/general")
        Self.drain(harness)
        let (backend, _) = try harness.connectNext()
        try harness.answer(backend, body: "one")
        harness.app.embeddedEventLoop.run()
        #expect(try harness.passedOn() == ["head /general", "end"])
        #expect(recorder.drains == 1)
    }

    /// A failed exchange (504) ends the hold too.
    @Test func aTimedOutExchangeReleasesTheDrain() throws {
        let (harness, recorder) = try Self.harness()
        try harness.request("/fast/1")
        Self.drain(harness)
        harness.app.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(try harness.written().first == "head 504 rid-/fast/1")
        #expect(recorder.drains == 1)
    }

    /// A second drain event is not passed on twice.
    @Test func theDrainIsPassedOnOnce() throws {
        let (harness, recorder) = try Self.harness()
        try harness.request("/fast/1")
        Self.drain(harness)
        Self.drain(harness)
        let (backend, _) = try harness.connectNext()
        try harness.answer(backend, body: "one")
        harness.app.embeddedEventLoop.run()
        Self.drain(harness)
        #expect(recorder.drains == 1)
    }
}
