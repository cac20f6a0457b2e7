import Foundation
import GatehouseCore
import Logging

extension UpstreamHTTP {
    /// Where the browser goes for a sign-in: the authorization endpoint with `parameters` in the
    /// query, or, when `pushTo` names a PAR endpoint, with only `client_id` and the `request_uri`
    /// the upstream gave for the same parameters pushed there with Gatehouse's client
    /// authentication (RFC 9126 §4). Nothing of the request (PKCE challenge, nonce, state) is then in
    /// the browser's URL, and the upstream knows it came from its client.
    func authorizationURL(endpoint: String, parameters: [(String, String)], pushTo: String?, tokenEndpoint: String)
        async throws(OAuthError) -> String
    {
        guard let pushTo else { return RedirectURI.appending(parameters, to: endpoint) }
        let requestURI = try await pushAuthorization(url: pushTo, parameters, tokenEndpoint: tokenEndpoint)
        return RedirectURI.appending([("client_id", settings.clientID), ("request_uri", requestURI)], to: endpoint)
    }

    /// RFC 9126 §2: the authorization request's parameters, pushed; the answer's `request_uri`.
    func pushAuthorization(url: String, _ parameters: [(String, String)], tokenEndpoint: String) async throws(OAuthError) -> String {
        let request = try settings.authenticatedForm(url: url, parameters, tokenEndpoint: tokenEndpoint)
        let (status, _, body) = try await sendWithHeaders(request, endpoint: .par, purpose: "pushed authorization request")
        guard status == 201 || status == 200 else {
            logger.warning("upstream pushed authorization request refused", metadata: [
                "upstream": .string(settings.name), "status": .stringConvertible(status),
            ])
            if status == 400 || status == 401 {
                let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
                let code = (object?["error"] as? String).map { " (\($0.prefix(64)))" } ?? ""
                throw .badUpstream("the authorization server refused Gatehouse's pushed authorization request\(code)")
            }
            if status == 429 || status == 503 {
                throw .upstreamUnavailable("the authorization server is temporarily unavailable (HTTP \(status))")
            }
            throw .badUpstream("the authorization server's pushed authorization request endpoint answered HTTP \(status)")
        }
        let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        guard let requestURI = object?["request_uri"] as? String, !requestURI.isEmpty, requestURI.count <= 2048 else {
            throw .badUpstream("the authorization server's pushed authorization response has no request_uri")
        }
        return requestURI
    }
}
