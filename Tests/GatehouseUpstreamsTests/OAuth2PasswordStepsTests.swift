import AsyncHTTPClient
import Foundation
import GatehouseCore
@testable import GatehouseUpstreams
import Logging
import NIOCore
import NIOHTTP1
import Testing

/// The `oauth2` kind's in-app steps on the wire: the password grant sent once with Gatehouse's
/// client credentials, Auth0's MFA dialect (`mfa_required`, `/mfa/challenge`, the `mfa-otp`
/// grant), and each refusal read as the catalog needs it. (The end-to-end suite runs the same
/// against django-oauth-toolkit and an Auth0 double built from Auth0's documentation.)
struct OAuth2PasswordStepsTests {
    static func steps(_ answers: [ScriptedUpstream.Answer], dialect: OAuth2PasswordGrant = .auth0, challenge: String? = nil,
                      authentication: ClientAuthentication = .clientSecretPost) -> (any InAppSignInSteps, ScriptedUpstream) {
        let upstream = ScriptedUpstream(answers)
        var oauth2 = OAuth2Settings(authorizationEndpoint: "https://tenant.example/authorize", tokenEndpoint: "https://tenant.example/oauth/token")
        oauth2.passwordGrant = dialect
        oauth2.mfaChallengeEndpoint = challenge
        let settings = UpstreamSettings(name: "auth0", kind: "oauth2", clientID: "gatehouse", clientSecret: Secret("s3cret"),
                                        clientAuthentication: authentication, profile: oauth2)
        let profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test")))
        return (profile.inAppSignIn!, upstream)
    }

    static func form(_ request: HTTPClientRequest) async throws -> [String: String] {
        guard let body = request.body else { return [:] }
        var collected = ByteBuffer()
        for try await var chunk in body { collected.writeBuffer(&chunk) }
        let form = try FormParameters(parsing: collected.readableBytesView)
        return Dictionary(uniqueKeysWithValues: form.names.compactMap { name in form[name].map { (name, $0) } })
    }

    static let tokens = #"{"access_token":"at","token_type":"Bearer","expires_in":60}"#

    @Test func thePasswordGoesOnceToTheTokenEndpointWithTheClientCredentials() async throws {
        let (steps, upstream) = Self.steps([.status(200, body: Self.tokens)])
        guard case .signedIn(let grant) = await steps.password(login: "ada@example.com", password: "pw", scopes: ["openid", "email"],
                                                                 clientAddress: "203.0.113.7")
        else { Issue.record("not signed in"); return }
        #expect(grant.tokens?.accessToken.reveal() == "at")
        #expect(upstream.calls == 1)
        #expect(upstream.requests[0].url == "https://tenant.example/oauth/token")
        let form = try await Self.form(upstream.requests[0])
        #expect(form == ["grant_type": "password", "username": "ada@example.com", "password": "pw", "scope": "openid email",
                         "client_id": "gatehouse", "client_secret": "s3cret"])
        // Auth0's attack protection counts the user's address, not Gatehouse's.
        #expect(upstream.requests[0].headers.first(name: "auth0-forwarded-for") == "203.0.113.7")
    }

    @Test func thePlainDialectTellsNoAddressAndBasicAuthenticationCarriesNoClientIDInTheBody() async throws {
        let (steps, upstream) = Self.steps([.status(200, body: Self.tokens)], dialect: .on, authentication: .clientSecretBasic)
        _ = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: "203.0.113.7")
        #expect(upstream.requests[0].headers.first(name: "auth0-forwarded-for") == nil)
        #expect(upstream.requests[0].headers.first(name: "Authorization")?.hasPrefix("Basic ") == true)
        #expect(try await Self.form(upstream.requests[0])["client_id"] == nil)
        // Auth0's MFA endpoints document client_id in the body: with Basic authentication it is added there.
        let (auth0, recorded) = Self.steps([.status(200, body: Self.tokens)], dialect: .auth0, authentication: .clientSecretBasic)
        _ = await auth0.password(login: "ada", password: "pw", scopes: [], clientAddress: nil)
        #expect(try await Self.form(recorded.requests[0])["client_id"] == "gatehouse")
    }

    @Test func auth0sMFARequiredAsksForTheOTPChallengeThenTheMFAOTPGrant() async throws {
        let mfa = #"{"error":"mfa_required","error_description":"Multifactor authentication required","mfa_token":"mfa-1"}"#
        let (steps, upstream) = Self.steps([.status(403, body: mfa), .status(200, body: #"{"challenge_type":"otp"}"#),
                                            .status(403, body: #"{"error":"invalid_grant","error_description":"Invalid otp_code."}"#),
                                            .status(200, body: Self.tokens)])
        guard case .secondFactor(let token) = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("no second factor"); return
        }
        #expect(token == "mfa-1")
        #expect(upstream.requests[1].url == "https://tenant.example/mfa/challenge")
        #expect(try await Self.form(upstream.requests[1])["challenge_type"] == "otp")
        #expect(try await Self.form(upstream.requests[1])["mfa_token"] == "mfa-1")
        guard case .refused(.wrongInput) = await steps.secondFactor(token: token, otp: "000000", clientAddress: nil) else { Issue.record("accepted"); return }
        guard case .signedIn = await steps.secondFactor(token: token, otp: "123456", clientAddress: nil) else { Issue.record("not signed in"); return }
        let last = try await Self.form(upstream.requests[3])
        #expect(last["grant_type"] == "http://auth0.com/oauth/grant-type/mfa-otp")
        #expect(last["mfa_token"] == "mfa-1" && last["otp"] == "123456" && last["password"] == nil)
    }

    @Test func aRefusedChallengeStillAsksForTheCode() async throws {
        let mfa = #"{"error":"mfa_required","mfa_token":"mfa-1"}"#
        let (steps, upstream) = Self.steps([.status(403, body: mfa), .status(400, body: #"{"error":"unsupported_challenge_type"}"#)])
        guard case .secondFactor = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("no second factor"); return
        }
        #expect(upstream.calls == 2)
    }

    @Test func withoutTheAuth0DialectMFARequiredIsNoSecondFactor() async throws {
        let mfa = #"{"error":"mfa_required","mfa_token":"mfa-1"}"#
        let (steps, upstream) = Self.steps([.status(403, body: mfa)], dialect: .on)
        guard case .refused(.unusable) = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("read as a second factor"); return
        }
        #expect(upstream.calls == 1)
    }

    @Test func aConfiguredChallengeEndpointIsUsed() async throws {
        let mfa = #"{"error":"mfa_required","mfa_token":"mfa-1"}"#
        let (steps, upstream) = Self.steps([.status(403, body: mfa), .status(200, body: "{}")], challenge: "https://mfa.example/challenge")
        _ = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: nil)
        #expect(upstream.requests.map(\.url) == ["https://tenant.example/oauth/token", "https://mfa.example/challenge"])
    }

    @Test(arguments: [
        (400, [(String, String)](), #"{"error":"invalid_grant","error_description":"Invalid credentials given."}"#, InAppRefusal.wrongInput),
        (403, [], #"{"error":"invalid_grant","error_description":"Wrong email or password."}"#, .wrongInput),
        (429, [("Retry-After", "42")], "", .rateLimited(retryAfter: 42)),
        (429, [], "", .rateLimited(retryAfter: 5)),
        (503, [], "", .unavailable),
        (504, [], "", .timeout),
        (401, [], #"{"error":"invalid_client"}"#, .unusable("HTTP 401 invalid_client")),
        (400, [], "<html>", .unusable("HTTP 400 without an OAuth error")),
        // Auth0's refusals of the account itself (its Authentication API error tables and SDKs).
        (401, [], #"{"error":"unauthorized","error_description":"user is blocked"}"#, .accountRefused(.blocked)),
        (401, [], #"{"error":"unauthorized","error_description":"Only staff may sign in to this app."}"#, .accountRefused(.denied)),
        (403, [], #"{"error":"access_denied","error_description":"You can't log in"}"#, .accountRefused(.denied)),
        // Auth0's answer to a wrong client secret: Gatehouse's own credentials, no account's refusal.
        (401, [], #"{"error":"access_denied","error_description":"Unauthorized"}"#, .unusable("HTTP 401 access_denied")),
        (401, [], #"{"error":"password_leaked","error_description":"This login attempt has been blocked because the password you're using was previously disclosed through a data breach (not in this application)."}"#,
         .accountRefused(.passwordLeaked)),
        (429, [], #"{"error":"too_many_attempts","error_description":"Your account has been blocked after multiple consecutive login attempts. We've sent you an email with instructions on how to unblock it."}"#,
         .accountRefused(.locked)),
        (429, [("Retry-After", "30")], #"{"error":"too_many_attempts","error_description":"We have detected suspicious login behavior and further attempts will be blocked. Please contact the administrator."}"#,
         .rateLimited(retryAfter: 30)),
    ])
    func refusalsAreReadForTheCatalog(status: Int, headers: [(String, String)], body: String, expected: InAppRefusal) async {
        let (steps, _) = Self.steps([.status(status, headers: headers, body: body)])
        guard case .refused(let refusal) = await steps.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("not refused"); return
        }
        #expect(refusal == expected)
    }

    @Test func anUnreachableOrSlowUpstreamIsUnavailableOrATimeout() async {
        let (refused, _) = Self.steps([.refused])
        guard case .refused(.unavailable) = await refused.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("not unavailable"); return
        }
        let (slow, _) = Self.steps([.failure(.deadlineExceeded)])
        guard case .refused(.timeout) = await slow.password(login: "ada", password: "pw", scopes: [], clientAddress: nil) else {
            Issue.record("not a timeout"); return
        }
    }
}
