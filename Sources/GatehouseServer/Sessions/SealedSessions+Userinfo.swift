import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import Hummingbird
import HTTPTypes

extension SealedSessions {
    /// `GET /userinfo` (OpenID Connect Core §5.3), Bearer = Gatehouse's access token: the claims
    /// the upstream gave at sign-in, verified, byte for byte as it gave them (for a signed userinfo,
    /// its payload). No upstream call: a short-lived upstream access token may be long dead by then.
    func userinfo(_ request: Request) async -> Response {
        let view: SessionServices.SessionView
        switch await appSession(request) {
        case .success(let found): view = found
        case .failure(let refusal): return refusal.response
        }
        guard let userinfo = view.userinfo else {
            return .problem(.notFound("This sign-in's upstream gave no userinfo."), for: request)
        }
        return .json(bytes: userinfo)
    }

    /// A refusal of `appSession`, as the response to send.
    struct AppTokenRefusal: Error {
        let response: Response
    }

    /// The live sealed session of the app's own access token: `Authorization: Bearer gha_…`, or
    /// `Authorization: DPoP ghd_…` with its proof (RFC 9449). Not refreshed: what was verified at
    /// sign-in is read, nothing upstream.
    func appSession(_ request: Request) async -> Result<SessionServices.SessionView, AppTokenRefusal> {
        let values = request.headers[values: .authorization]
        let invalid = AppTokenRefusal(response: Self.bearerChallenge(request, error: "invalid_token",
                                                                     detail: "The access token is invalid, expired or revoked."))
        let token: String
        let scheme: RelayAdmission.Scheme
        if let bearer = RelayAdmission.bearerToken(values) {
            guard bearer.hasPrefix(SessionServices.accessPrefix) || bearer.hasPrefix(SessionServices.boundAccessPrefix) else {
                return .failure(invalid)
            }
            (token, scheme) = (bearer, .bearer)
        } else if let bound = RelayAdmission.token(values, scheme: "dpop ") {
            guard bound.hasPrefix(SessionServices.boundAccessPrefix) else {
                return .failure(AppTokenRefusal(response: dpop.refusal(request, error: "invalid_token",
                                                                      detail: "Only a DPoP-bound access token is sent with the DPoP scheme.")))
            }
            (token, scheme) = (bound, .dpop)
        } else {
            // No credentials at all: a bare challenge (RFC 6750 §3.1).
            return .failure(AppTokenRefusal(response: Self.bearerChallenge(
                request, error: nil, detail: "A Gatehouse access token is required (Authorization: Bearer).")))
        }
        switch await services.view(forGatehouseToken: token, refreshing: false, upstreams: upstreams) {
        case .fresh(let view):
            if token.hasPrefix(SessionServices.boundAccessPrefix),
               let refusal = await dpop.refusingBoundToken(request, token: token, scheme: scheme, boundThumbprint: view.dpopJKT) {
                return .failure(AppTokenRefusal(response: refusal))
            }
            return .success(view)
        case .ended:
            return .failure(invalid)
        case .unavailable:
            return .failure(AppTokenRefusal(response: .unavailable(.storeUnavailable(), for: request)))
        }
    }

    /// 401 with an RFC 6750 §3 challenge.
    static func bearerChallenge(_ request: Request, error: String?, detail: String) -> Response {
        var response = Response.problem(.invalidToken(detail), for: request)
        response.headers[.wwwAuthenticate] = error.map { #"Bearer realm="gatehouse", error="\#($0)""# } ?? #"Bearer realm="gatehouse""#
        return response
    }
}
