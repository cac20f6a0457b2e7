import GatehouseCore
import NIOCore
import NIOHTTP1

extension ProblemBody {
    /// A problem as NIO response parts, for the handlers that answer inside the channel
    /// pipeline (the connection's edge, the relay's fast path): the same document and headers
    /// as `Response.problem`, without Hummingbird.
    static func responseParts(_ problem: GatehouseProblem, instance: String, requestID: String, closing: Bool = false)
        -> (head: HTTPResponseHead, body: ByteBuffer)
    {
        let body = JSONCoding.encode(ProblemBody(problem, instance: instance))
        var headers: HTTPHeaders = [
            "Content-Type": "application/problem+json", "Cache-Control": "no-store",
            "Content-Length": String(body.count), "X-Request-Id": requestID,
        ]
        if closing { headers.add(name: "Connection", value: "close") }
        return (HTTPResponseHead(version: .http1_1, status: .init(statusCode: problem.status), headers: headers), ByteBuffer(bytes: body))
    }
}
