import Foundation
public import GatehouseCore
import Logging
import NIOHTTP1

/// A second-factor dialect an `oauth2` upstream may answer the password grant with.
public enum OAuth2SecondFactor: String, Sendable, CaseIterable {
    /// Auth0's documented MFA for the password grant: `403 mfa_required` with an `mfa_token`,
    /// `POST /mfa/challenge` (`challenge_type=otp`), then the grant
    /// `http://auth0.com/oauth/grant-type/mfa-otp` with the `mfa_token` and the `otp`.
    case auth0
}

/// In-app sign-in at an `oauth2` upstream that takes the resource-owner password grant
/// (RFC 6749 §4.3): the password goes once to the token endpoint with Gatehouse's client
/// credentials; a second factor, when the upstream asks for one in a dialect Gatehouse knows.
struct OAuth2PasswordSteps: InAppSignInSteps {
    let oauth2: OAuth2Settings
    let http: UpstreamHTTP

    static let mfaOTPGrant = "http://auth0.com/oauth/grant-type/mfa-otp"

    var firstStep: InAppFirstStep { .password }

    func password(login: String, password: String, scopes: [String]) async -> InAppOutcome {
        var form = [("grant_type", "password"), ("username", login), ("password", password)]
        if !scopes.isEmpty { form.append(("scope", scopes.joined(separator: " "))) }
        let outcome = await tokenCall(form, purpose: "password grant")
        guard case .secondFactor(let token) = outcome else { return outcome }
        // Auth0: the OTP challenge is asked for once, then the code is verified at the token endpoint.
        let challenge = [("mfa_token", token), ("challenge_type", "otp")]
        let request = http.settings.authenticatedForm(url: challengeEndpoint, challenge)
        do {
            let (status, _, body) = try await http.sendWithHeaders(request, endpoint: .token, purpose: "second-factor challenge")
            guard status == 200 else { return .refused(Self.refusal(status: status, headers: [:], body: body)) }
        } catch {
            return .refused(InAppRefusal(error))
        }
        return outcome
    }

    func secondFactor(token: String, otp: String) async -> InAppOutcome {
        await tokenCall([("grant_type", Self.mfaOTPGrant), ("mfa_token", token), ("otp", otp)], purpose: "second factor")
    }

    /// Auth0 documents `/mfa/challenge` beside `/oauth/token` on the tenant's domain.
    var challengeEndpoint: String {
        if let configured = oauth2.mfaChallengeEndpoint { return configured }
        guard var parts = URLComponents(string: oauth2.tokenEndpoint) else { return oauth2.tokenEndpoint }
        parts.path = "/mfa/challenge"
        parts.query = nil
        return parts.string ?? oauth2.tokenEndpoint
    }

    /// One call to the token endpoint with Gatehouse's client credentials, read as an in-app outcome.
    private func tokenCall(_ form: [(String, String)], purpose: String) async -> InAppOutcome {
        let request = http.settings.authenticatedForm(url: oauth2.tokenEndpoint, form)
        let answer: (status: Int, headers: HTTPHeaders, body: Data)
        do {
            answer = try await http.sendWithHeaders(request, endpoint: .token, purpose: purpose)
        } catch {
            return .refused(InAppRefusal(error))
        }
        if answer.status == 200 {
            do throws(OAuthError) {
                return .signedIn(UpstreamGrant(tokens: try UpstreamTokenResponse(body: answer.body)))
            } catch {
                return .refused(.unusable(error.detail))
            }
        }
        let object = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any]
        if oauth2.secondFactor == .auth0, answer.status == 403, object?["error"] as? String == "mfa_required",
           let token = object?["mfa_token"] as? String, !token.isEmpty {
            return .secondFactor(token: token)
        }
        let refusal = Self.refusal(status: answer.status, headers: answer.headers, body: answer.body)
        if case .unusable(let detail) = refusal {
            http.logger.warning("upstream \(purpose) refused", metadata: [
                "upstream": .string(http.settings.name), "status": .stringConvertible(answer.status), "reason": .string(detail),
            ])
        }
        return .refused(refusal)
    }

    /// An upstream's refusal: `invalid_grant` (RFC 6749 §5.2; Auth0 answers it with 403) is a
    /// wrong password or code; 429 a request to slow down; 5xx an unavailable upstream.
    static func refusal(status: Int, headers: HTTPHeaders, body: Data) -> InAppRefusal {
        if status == 429 {
            // Read as every 429 of an upstream is (delay-seconds or an HTTP-date, 1 s to 5 min).
            let wait = UpstreamBackoff.wait(retryAfter: headers.first(name: "Retry-After"), now: Date())
            return .rateLimited(retryAfter: UpstreamBackoff.wholeSeconds(wait))
        }
        if status >= 500 { return status == 504 ? .timeout : .unavailable }
        let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any]
        guard let code = object?["error"] as? String else { return .unusable("HTTP \(status) without an OAuth error") }
        if code == "invalid_grant" { return .wrongInput }
        return .unusable("HTTP \(status) \(code.prefix(64))")
    }
}
