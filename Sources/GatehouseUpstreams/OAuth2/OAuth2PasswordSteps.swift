import AsyncHTTPClient
import Foundation
public import GatehouseCore
import Logging
import NIOHTTP1

/// `upstreams[].password_grant` of an `oauth2` upstream: whether it takes the resource-owner
/// password grant from Gatehouse, and in which dialect.
public enum OAuth2PasswordGrant: String, Sendable, CaseIterable {
    case off = "false"
    /// RFC 6749 §4.3 as written.
    case on = "true"
    /// Auth0's documented password grant: the user's address in `auth0-forwarded-for` (so that its
    /// attack protection counts the user, not Gatehouse), and its MFA: `403 mfa_required` with an
    /// `mfa_token`, `POST /mfa/challenge` (`challenge_type=otp`), then the grant
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

    private var auth0: Bool { oauth2.passwordGrant == .auth0 }

    func password(login: String, password: String, scopes: [String], clientAddress: String?) async -> InAppOutcome {
        var form = [("grant_type", "password"), ("username", login), ("password", password)]
        if !scopes.isEmpty { form.append(("scope", scopes.joined(separator: " "))) }
        let outcome = await tokenCall(form, clientAddress: clientAddress, purpose: "password grant")
        guard case .secondFactor(let token) = outcome else { return outcome }
        // Auth0: an OTP challenge is asked for once, then the code is verified at the token
        // endpoint. Auth0 documents the challenge as optional for OTP authenticators: a refused
        // one is logged, and the code decides.
        var refused: InAppRefusal?
        do throws(InAppRefusal) {
            let answer = try await send(challengeEndpoint, [("mfa_token", token), ("challenge_type", "otp")], clientAddress: clientAddress,
                                        purpose: "second-factor challenge")
            if answer.status != 200 { refused = Self.refusal(answer, auth0: auth0) }
        } catch {
            refused = error
        }
        if let refusal = refused {
            http.logger.notice("upstream second-factor challenge refused; the code is asked for anyway", metadata: [
                "upstream": .string(http.settings.name), "refusal": .string(String(describing: refusal)),
            ])
        }
        return outcome
    }

    func secondFactor(token: String, otp: String, clientAddress: String?) async -> InAppOutcome {
        await tokenCall([("grant_type", Self.mfaOTPGrant), ("mfa_token", token), ("otp", otp)], clientAddress: clientAddress,
                        purpose: "second factor")
    }

    /// Auth0 documents `/mfa/challenge` beside `/oauth/token` on the tenant's domain.
    var challengeEndpoint: String {
        if let configured = oauth2.mfaChallengeEndpoint { return configured }
        guard var parts = URLComponents(string: oauth2.tokenEndpoint) else { return oauth2.tokenEndpoint }
        parts.path = "/mfa/challenge"
        parts.query = nil
        return parts.string ?? oauth2.tokenEndpoint
    }

    /// An upstream's whole answer.
    typealias Answer = (status: Int, headers: HTTPHeaders, body: Data)

    /// One call with Gatehouse's client credentials (and, to Auth0, `client_id` in the body as its
    /// MFA endpoints document, and the user's address); a transport failure is thrown as a refusal.
    private func send(_ url: String, _ form: [(String, String)], clientAddress: String?, purpose: String) async throws(InAppRefusal) -> Answer {
        var form = form
        if auth0, http.settings.clientAuthentication == .clientSecretBasic { form.append(("client_id", http.settings.clientID)) }
        do throws(OAuthError) {
            // An assertion names the endpoint it goes to: the token endpoint, or the MFA challenge endpoint.
            var request = try http.settings.authenticatedForm(url: url, form, tokenEndpoint: oauth2.tokenEndpoint)
            if auth0, let clientAddress { request.headers.add(name: "auth0-forwarded-for", value: clientAddress) }
            return try await http.sendWithHeaders(request, endpoint: .token, purpose: purpose)
        } catch {
            throw InAppRefusal(error)
        }
    }

    /// A token-endpoint call, read as an in-app outcome: tokens, Auth0's second factor, or a refusal.
    private func tokenCall(_ form: [(String, String)], clientAddress: String?, purpose: String) async -> InAppOutcome {
        let answer: Answer
        do throws(InAppRefusal) {
            answer = try await send(oauth2.tokenEndpoint, form, clientAddress: clientAddress, purpose: purpose)
        } catch {
            return .refused(error)
        }
        if answer.status == 200 {
            do throws(OAuthError) {
                return .signedIn(UpstreamGrant(tokens: try UpstreamTokenResponse(body: answer.body)))
            } catch {
                return .refused(.unusable(error.detail))
            }
        }
        let object = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any]
        if auth0, answer.status == 403, object?["error"] as? String == "mfa_required",
           let token = object?["mfa_token"] as? String, !token.isEmpty {
            return .secondFactor(token: token)
        }
        let refusal = Self.refusal(answer, auth0: auth0)
        if case .unusable(let detail) = refusal {
            http.logger.warning("upstream \(purpose) refused", metadata: [
                "upstream": .string(http.settings.name), "status": .stringConvertible(answer.status), "reason": .string(detail),
            ])
        }
        return .refused(refusal)
    }

    /// An upstream's refusal: `invalid_grant` (RFC 6749 §5.2; Auth0 answers it with 403) is a
    /// wrong password or code; a refusal of the account itself (`accountRefusal`) is told apart
    /// (the server answers it as a wrong password until a second factor is passed); 429 a request
    /// to slow down; 5xx an unavailable upstream.
    static func refusal(_ answer: Answer, auth0: Bool) -> InAppRefusal {
        let object = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any]
        if (400..<500).contains(answer.status), let code = object?["error"] as? String,
           let refused = accountRefusal(code: code, status: answer.status, description: object?["error_description"] as? String, auth0: auth0) {
            return .accountRefused(refused)
        }
        if answer.status == 429 {
            // Read as every 429 of an upstream is (delay-seconds or an HTTP-date, 1 s to 5 min).
            let wait = UpstreamBackoff.wait(retryAfter: answer.headers.first(name: "Retry-After"), now: Date())
            return .rateLimited(retryAfter: UpstreamBackoff.wholeSeconds(wait))
        }
        if answer.status >= 500 { return answer.status == 504 ? .timeout : .unavailable }
        guard let code = object?["error"] as? String else { return .unusable("HTTP \(answer.status) without an OAuth error") }
        if code == "invalid_grant" { return .wrongInput }
        return .unusable("HTTP \(answer.status) \(code.prefix(64))")
    }

    /// The refusals of an account that may come after its right password, as Auth0 documents
    /// them for the password grant: 401 `unauthorized` "user is blocked" (a blocked user; any
    /// other `unauthorized` is a rule's refusal), 429 `too_many_attempts` "Your account has been
    /// blocked after multiple consecutive login attempts…" (brute-force protection; the same code
    /// from suspicious-IP throttling, "We have detected suspicious login behavior…", is the
    /// client's address slowed down and read as any 429), 401 `password_leaked` (breached
    /// password detection), 403 `access_denied` (an Action's `api.access.deny`, and any server's
    /// policy). A 401 `access_denied` is Gatehouse's own client authentication refused (Auth0
    /// answers a wrong client secret so): no account's doing, an unusable answer.
    static func accountRefusal(code: String, status: Int, description: String?, auth0: Bool) -> AccountRefusal? {
        switch code {
        case "access_denied": return status == 401 ? nil : .denied
        case "too_many_attempts":
            return description?.lowercased().contains("suspicious") == true ? nil : .locked
        case "password_leaked": return .passwordLeaked
        case "unauthorized" where auth0:
            return description?.lowercased().contains("blocked") == true ? .blocked : .denied
        default: return nil
        }
    }
}
