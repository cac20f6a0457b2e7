import Foundation
import GatehouseCore
import GatehouseRelay
import NIOHTTP1
import Testing

/// The one admission decision of both relay paths, tested without a server.
struct RelayAdmissionTests {
    struct Head: RelayRequestHead {
        var methodName = "GET"
        var rawTarget = "/api/contracts/1"
        var fields: [(String, String)] = [("Authorization", "Bearer t0ken")]

        func values(of field: RelayHeadField) -> [String] {
            let name = switch field {
            case .authorization: "authorization"
            case .contentLength: "content-length"
            case .transferEncoding: "transfer-encoding"
            case .expect: "expect"
            case .connection: "connection"
            }
            return fields.filter { $0.0.lowercased() == name }.map(\.1)
        }

        func forEachField(_ body: (String, String) -> Void) {
            for (name, value) in fields { body(name, value) }
        }
    }

    static let route = RouteSettings(prefix: "/api/contracts", backend: "http://127.0.0.1:1/contracts", methods: ["GET", "HEAD", "POST"],
                                     upstream: "u", identityHeaders: [(name: "X-BPId", source: "bpid")], maximumBodyBytes: 1024)

    static func admit(_ head: Head) -> Result<RelayAdmission, RelayRefusal> {
        RelayAdmission.admit(head, route: route, backendPath: "/contracts")
    }

    static func status(_ head: Head) -> Int? {
        switch admit(head) {
        case .success: nil
        case .failure(.signIn): 401
        case .failure(.problem(let problem, _)): problem.status
        }
    }

    @Test func aPlainRequestIsAdmittedWithItsTargetAndToken() throws {
        let admission = try Self.admit(Head(rawTarget: "/api/contracts/1?x=%41")).get()
        #expect(admission.target == "/contracts/1?x=%41")
        #expect(admission.bearer == "t0ken")
        #expect(admission.body == .none)
    }

    @Test func refusalsComeInTheOrderAnAppCanActOn() {
        #expect(Self.status(Head(methodName: "DELETE", rawTarget: "/api/contracts/%ff", fields: [])) == 405)
        #expect(Self.status(Head(rawTarget: "/api/contracts/%ff", fields: [])) == 400)
        #expect(Self.status(Head(methodName: "POST", fields: [("Content-Length", "4096")])) == 413)
        #expect(Self.status(Head(fields: [])) == 401)
        #expect(Self.status(Head(fields: [("Authorization", "Basic YTpi")])) == 401)
        #expect(Self.status(Head(fields: [("Authorization", "Bearer a"), ("Authorization", "Bearer b")])) == 401)
    }

    @Test func framingIsAnsweredAsTheProtocolSays() throws {
        #expect(Self.status(Head(methodName: "POST", fields: [("Transfer-Encoding", "gzip, chunked"), ("Authorization", "Bearer t")])) == 501)
        #expect(Self.status(Head(fields: [("Expect", "teapot"), ("Authorization", "Bearer t")])) == 417)
        let chunked = try Self.admit(Head(methodName: "POST", fields: [("Transfer-Encoding", "Chunked"), ("Expect", "100-continue"),
                                                                      ("Authorization", "Bearer t")])).get()
        #expect(chunked.body == .chunked)
        #expect(chunked.expectsContinue)
    }

    @Test func theRouteRuleIsA403NamingTheRule() {
        var route = Self.route
        route.rule = RouteRule(attributes: ["bpid_status": "active"])
        let admission = try? RelayAdmission.admit(Head(), route: route, backendPath: "/contracts").get()
        let identity = CallerIdentity(subject: "bob", bpid: "1", scopes: [], attributes: ["bpid_status": "blocked"], expiresAt: nil)
        #expect(admission?.authorize(identity)?.status == 403)
        #expect(admission?.authorize(identity)?.detail == "This route requires 'bpid_status' to be 'active'.")
    }

    /// Item 3 of the issue: the whole forwarding family is stripped, underscore variants included.
    @Test(arguments: [
        "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-User", "X-Forwarded-Email",
        "X-Forwarded-Prefix", "X-Forwarded-Server", "X-Forwarded-Ssl", "X-Forwarded-Uri", "X-Forwarded", "Forwarded", "X-Real-IP",
        "X-Original-URL", "X-Original-URI", "X-Rewrite-URL", "True-Client-IP", "X-Client-IP", "Client-IP", "CF-Connecting-IP",
        "X-Cluster-Client-IP", "Fastly-Client-IP", "X-Originating-IP", "X-Remote-IP", "X-Remote-Addr", "X-Host", "X-Original-Host",
        "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "Via", "X-Request-Id", "X-Client-Request-Id",
        "X-Original-Forwarded-For", "X-Remote-User", "Remote-User", "X-Authenticated-User", "X-WEBAUTH-USER",
        "X-Auth-Request-User", "X-Auth-Request-Email", "X-Auth-Request-Groups", "X-Envoy-Original-Path",
    ])
    func forwardingHeadersFromTheClientNeverReachTheBackend(name: String) {
        let policy = RelayHeaderPolicy(route: Self.route, allIdentityHeaders: [])
        for variant in [name, name.lowercased(), name.uppercased(), name.replacingOccurrences(of: "-", with: "_")] {
            #expect(!policy.forwardsRequestHeader(variant, connectionTokens: []), "\(variant)")
        }
    }

    @Test func outboundHeadersCarryGatehouseIdsAndSafeIdentityValues() {
        let policy = RelayHeaderPolicy(route: Self.route, allIdentityHeaders: [])
        let head = Head(fields: [("Authorization", "Bearer t"), ("X-Request-Id", "app-42"), ("X-Forwarded-User", "admin"),
                                 ("Accept", "application/json")])
        let identity = CallerIdentity(subject: "eve", bpid: "1000999\r\nX-Injected: yes", scopes: [], attributes: [:], expiresAt: nil)
        let headers = policy.outboundHeaders(from: head, connectionTokens: [], identity: identity, authorization: nil, host: "b:1",
                                             forwarding: RelayForwarding(publicBaseURL: "https://g.example"),
                                             peer: RelayForwarding(publicBaseURL: "https://g.example").peer("10.0.0.1"), requestID: "gh-1",
                                             clientRequestID: RelayForwarding.acceptableClientRequestID("app-42"))
        #expect(headers["x-request-id"] == ["gh-1"])
        #expect(headers["x-client-request-id"] == ["app-42"])
        #expect(headers["x-forwarded-user"].isEmpty)
        #expect(headers["authorization"].isEmpty)
        #expect(headers["x-bpid"] == ["1000999X-Injected: yes"])
        #expect(headers["x-injected"].isEmpty)
        #expect(headers["accept"] == ["application/json"])
        #expect(headers.first(name: "host") == "b:1")
    }

    /// The fast path's answer head: hop-by-hop headers, the ones `Connection` lists and the
    /// backend's own request id never reach the app; everything else does, in order.
    @Test func relayedResponseHeadersDropHopByHopAndListedOnes() {
        let backend: HTTPHeaders = [
            "Content-Type": "application/json", "Connection": "keep-alive, X-Internal", "Keep-Alive": "timeout=5",
            "X-Internal": "secret", "x-request-id": "theirs", "Transfer-Encoding": "chunked", "ETag": "\"1\"",
        ]
        let relayed = RelayHeaderPolicy.relayedResponseHeaders(backend, requestID: "ours")
        #expect(relayed.map { "\($0.name): \($0.value)" } == ["Content-Type: application/json", "ETag: \"1\"", "X-Request-Id: ours"])
        let plain = RelayHeaderPolicy.relayedResponseHeaders(["Connection": " Keep-Alive ", "X-Keep": "yes"], requestID: "r")
        #expect(plain.map(\.name) == ["X-Keep", "X-Request-Id"])
    }
}
