import Foundation
import GatehouseCore
import GatehouseRelay
import Hummingbird
import HTTPTypes
import NIOCore

extension Gatehouse {
    /// `GET /userinfo` (OpenID Connect Core §5.3), Bearer = Gatehouse's access token: the claims
    /// the upstream gave at sign-in, verified, byte for byte as it gave them (for a signed userinfo,
    /// its payload). No upstream call: FranceConnect's access token is long dead by then.
    func userinfo(_ request: Request) async -> Response {
        let values = request.headers[values: .authorization]
        // No Bearer credentials at all: a bare challenge (RFC 6750 §3.1); a Bearer token that is
        // not a live Gatehouse access token: invalid_token.
        guard values.count == 1, let value = values.first, value.count > 7, value.prefix(7).lowercased() == "bearer " else {
            return Self.bearerChallenge(request, error: nil, detail: "A Gatehouse access token is required (Authorization: Bearer).")
        }
        guard let token = RelayAdmission.bearerToken(values), let sessions, token.hasPrefix(SessionServices.accessPrefix) else {
            return Self.bearerChallenge(request, error: "invalid_token", detail: "The access token is invalid, expired or revoked.")
        }
        switch await sessions.view(forGatehouseToken: token, refreshing: false, upstreams: upstreams) {
        case .fresh(let view):
            guard let userinfo = view.userinfo else {
                return .problem(.notFound("This sign-in's upstream gave no userinfo."), for: request)
            }
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            headers[.cacheControl] = "no-store"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: userinfo)))
        case .ended:
            return Self.bearerChallenge(request, error: "invalid_token", detail: "The access token is invalid, expired or revoked.")
        case .unavailable:
            return .unavailable(.storeUnavailable(), for: request)
        }
    }

    /// 401 with an RFC 6750 §3 challenge.
    static func bearerChallenge(_ request: Request, error: String?, detail: String) -> Response {
        var response = Response.problem(.invalidToken(detail), for: request)
        response.headers[.wwwAuthenticate] = error.map { #"Bearer realm="gatehouse", error="\#($0)""# } ?? #"Bearer realm="gatehouse""#
        return response
    }
}
