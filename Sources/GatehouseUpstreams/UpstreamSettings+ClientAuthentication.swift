public import AsyncHTTPClient
import Foundation
public import GatehouseCore
import NIOCore
import NIOHTTP1

extension UpstreamSettings {
    /// A form POST to one of this upstream's endpoints (token, revocation, introspection)
    /// carrying Gatehouse's client credentials the way the upstream wants them (RFC 6749 §2.3.1).
    public func authenticatedForm(url: String, _ parameters: [(String, String)]) -> HTTPClientRequest {
        var form = parameters
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        request.headers.add(name: "Accept", value: "application/json")
        switch clientAuthentication {
        case .clientSecretBasic:
            // Both parts are form-encoded before they are joined.
            let pair = FormParameters.encode(clientID) + ":" + FormParameters.encode(clientSecret.reveal())
            request.headers.add(name: "Authorization", value: "Basic " + Data(pair.utf8).base64EncodedString())
        case .clientSecretPost:
            form.append(("client_id", clientID))
            form.append(("client_secret", clientSecret.reveal()))
        }
        let body = FormParameters.encode(pairs: form)
        request.body = .bytes(ByteBuffer(string: body))
        return request
    }
}
