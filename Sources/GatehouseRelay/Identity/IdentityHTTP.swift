import AsyncHTTPClient
import Foundation
import GatehouseCore
import NIOCore
import NIOHTTP1

/// One request to an identity service: status and body, or why there is none.
enum IdentityHTTP {
    static let maximumResponseBytes = 256 * 1024

    static func send(_ request: HTTPClientRequest, timeout: Duration, client: HTTPClient) async throws(IdentityUnavailable)
        -> (status: Int, body: Data)
    {
        do {
            let response = try await client.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
            let body = try await response.body.collect(upTo: maximumResponseBytes)
            return (Int(response.status.code), Data(body.readableBytesView))
        } catch let error as HTTPClientError where [.deadlineExceeded, .readTimeout].contains(error) {
            throw IdentityUnavailable(.timeout, "the identity service did not answer in time")
        } catch is NIOTooManyBytesError {
            throw IdentityUnavailable(.badResponse, "the identity service's answer is too large")
        } catch {
            throw IdentityUnavailable(.unreachable, "the identity service cannot be reached")
        }
    }

    static func json(_ body: Data) throws(IdentityUnavailable) -> [String: Any] {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] else {
            throw IdentityUnavailable(.badResponse, "the identity service's answer is not a JSON object")
        }
        return object
    }
}
