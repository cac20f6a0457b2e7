import Foundation
import GatehouseCore
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

/// A sign-in paused for manual certification, sealed under its pending id (which only the
/// browser holds, in the page's form): what the app gets once the user allows it.
struct PendingCertification: Codable {
    let issued: IssuedCode
    let appState: String
    let instanceID: String
    let maskedEmail: String
}

extension AppInstances {
    static let certificationLifetime: TimeInterval = 600
    static let certificationAttempts = 5
    private static let certificationPurpose = "gatehouse certification v1"

    /// Seed 000's fallback when an instance cannot attest (LineageOS and other de-Googled phones):
    /// after the upstream sign-in of an uncertified instance of an app with `attestation: required`
    /// and `manual_certification`, and before the app gets its code, Gatehouse e-mails a 6-digit code
    /// to the address of the sign-in and asks for it. `nil`: nothing to pause for.
    func certificationPause(_ issued: IssuedCode, appState: String, request: Request) async -> Response? {
        guard let client = configuration.appClient(for: issued.clientID), client.isInstance, let settings = client.instances,
              settings.attestation == .required, settings.manualCertification else { return nil }
        let instance: InstanceRecord?
        do {
            instance = try await store.instance(id: issued.clientID)
        } catch {
            return .redirect(to: appRedirect(issued.redirectURI, error: .serverError("Gatehouse cannot reach its store right now"), state: appState))
        }
        guard let instance, instance.isLive(at: now()) else {
            return .redirect(to: appRedirect(issued.redirectURI, error: .unauthorizedClient("this app instance is unknown, expired or revoked"),
                                             state: appState))
        }
        guard instance.certification == nil else { return nil }
        let denied = appRedirect(issued.redirectURI, error: .accessDenied("this app instance could not be certified"), state: appState)
        guard let email = Self.verifiedEmail(in: issued.userinfo) else {
            logger.info("manual certification impossible: the sign-in gives no e-mail address")
            return CertificationPage.page(
                title: "This app cannot be certified", status: .ok,
                paragraphs: ["Your sign-in gives Gatehouse no e-mail address, so it cannot send you a code to allow this app on this device.",
                             "Use the app on a device that can attest it, or ask your administrator."],
                form: .link(denied, "Back to the app"))
        }
        guard let mailer else { return .redirect(to: denied) }
        let pending = SecureToken.generate()
        let code = Self.sixDigits()
        let record = PendingCertification(issued: issued, appState: appState, instanceID: instance.id, maskedEmail: Self.masked(email))
        do {
            let sealed = try TokenSeal.seal(JSONEncoder().encode(record), with: pending, purpose: Self.certificationPurpose)
            try await store.insertCertification(idHash: SecureToken.hash(pending), sealed: sealed, codeHash: Self.codeHash(pending: pending, code: code),
                                                expiresAt: now().addingTimeInterval(Self.certificationLifetime))
        } catch {
            return .redirect(to: appRedirect(issued.redirectURI, error: .serverError("Gatehouse could not record the sign-in"), state: appState))
        }
        do {
            try await mailer.send(MailMessage(to: email, subject: "Your code to allow \(instance.softwareID)", body: """
                Someone signed in to \(instance.softwareID) on a new device and asked to allow it.

                Your code: \(code)

                It is valid for 10 minutes. If this was not you, ignore this e-mail: without the code nothing happens.
                """))
        } catch {
            logger.warning("manual certification e-mail not sent", metadata: ["error": .string(String(describing: error))])
            return CertificationPage.page(
                title: "The code could not be sent", status: .serviceUnavailable,
                paragraphs: ["Gatehouse could not send the e-mail with your code. Start the sign-in again from the app in a moment."],
                form: .link(appRedirect(issued.redirectURI, error: .upstreamUnavailable("the certification e-mail could not be sent"),
                                        state: appState), "Back to the app"))
        }
        logger.info("manual certification code sent", metadata: ["instance": .string(Self.instanceLabel(instance.id))])
        return CertificationPage.codePage(pending: pending, maskedEmail: record.maskedEmail, app: instance.softwareID, notice: nil)
    }

    /// `POST /oauth/certify` (`pending`, `code`): one try of the e-mailed code.
    func certify(_ request: Request) async -> Response {
        guard let form = await certificationForm(request, names: ["pending", "code"]), let pending = form["pending"],
              Self.isPendingID(pending) else {
            return CertificationPage.expired()
        }
        let code = (form["code"] ?? "").filter { !$0.isWhitespace }
        guard code.count == 6, code.allSatisfy(\.isASCII), code.allSatisfy(\.isNumber) else {
            var page = await reshowCodePage(pending: pending, notice: "The code has 6 digits.")
            page.status = .badRequest
            return page
        }
        let attempt: CertificationAttempt
        do {
            attempt = try await store.attemptCertification(idHash: SecureToken.hash(pending), codeHash: Self.codeHash(pending: pending, code: code),
                                                           maximumAttempts: Self.certificationAttempts, now: now())
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        switch attempt {
        case .verified(let sealed):
            guard let record = Self.open(sealed, pending: pending) else { return CertificationPage.expired() }
            return CertificationPage.allowPage(pending: pending, app: record.issued.clientID.split(separator: InstanceID.separator).first.map(String.init) ?? "",
                                               maskedEmail: record.maskedEmail)
        case .wrong(let remaining) where remaining > 0:
            return await reshowCodePage(pending: pending, notice: "This code is not the right one: \(remaining) tr\(remaining == 1 ? "y" : "ies") left.")
        case .wrong, .locked:
            audit.record(.certification_locked, clientID: nil, subject: nil, reason: "too_many_codes")
            return CertificationPage.page(title: "This sign-in is locked", status: .forbidden,
                                          paragraphs: ["The code was wrong \(Self.certificationAttempts) times. Start the sign-in again from the app."],
                                          form: nil)
        case .unknown:
            return CertificationPage.expired()
        }
    }

    /// `POST /oauth/certify/allow` (`pending`, `decision`): "Allow this app", or not.
    func certifyAllow(_ request: Request) async -> Response {
        guard let form = await certificationForm(request, names: ["pending", "decision"]), let pending = form["pending"],
              Self.isPendingID(pending), let decision = form["decision"], decision == "allow" || decision == "deny" else {
            return CertificationPage.expired()
        }
        let sealed: Data?
        do {
            sealed = try await store.consumeCertification(idHash: SecureToken.hash(pending), now: now())
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        guard let sealed, let record = Self.open(sealed, pending: pending) else { return CertificationPage.expired() }
        guard decision == "allow" else {
            logger.info("manual certification declined by the user")
            return .seeOther(appRedirect(record.issued.redirectURI, error: .accessDenied("the user did not allow this app"), state: record.appState))
        }
        let certified: Bool
        do {
            certified = try await store.certifyInstance(id: record.instanceID, as: .manual, now: now())
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        guard certified else {
            return .seeOther(appRedirect(record.issued.redirectURI, error: .unauthorizedClient("this app instance is unknown, expired or revoked"),
                                         state: record.appState))
        }
        audit.record(.instance_certified, clientID: record.instanceID, subject: record.issued.subject, metadata: [
            "method": .string("manual"),
        ])
        var response = await redirectWithCode(record.issued, appState: record.appState)
        response.status = .seeOther
        return response
    }

    private func reshowCodePage(pending: String, notice: String) async -> Response {
        CertificationPage.codePage(pending: pending, maskedEmail: nil, app: nil, notice: notice)
    }

    private func certificationForm(_ request: Request, names: Set<String>) async -> FormParameters? {
        guard Self.refusingNonFormBody(request) == nil else { return nil }
        guard let body = await boundedBody(request) else { return nil }
        return try? FormParameters(parsing: body.readableBytesView, recognizing: names)
    }

    private static func open(_ sealed: Data, pending: String) -> PendingCertification? {
        (try? TokenSeal.open(sealed, with: pending, purpose: certificationPurpose)).flatMap { try? JSONDecoder().decode(PendingCertification.self, from: $0) }
    }

    /// Whether `text` has the shape of a pending id (`SecureToken`: 43 base64url characters).
    static func isPendingID(_ text: String) -> Bool {
        text.utf8.count == 43 && Base64URL.decode(text)?.count == 32
    }

    /// The code's hash is keyed by the pending id: a copy of the store cannot try the million codes.
    static func codeHash(pending: String, code: String) -> String {
        SecureToken.hash(pending + ":" + code)
    }

    /// Six decimal digits from the system's secure generator, uniform (no modulo bias).
    static func sixDigits() -> String {
        var generator = SystemRandomNumberGenerator()
        let value = UInt32.random(in: 0..<1_000_000, using: &generator)
        let text = String(value)
        return String(repeating: "0", count: 6 - text.count) + text
    }

    /// The sign-in's e-mail address: the verified userinfo's `email`, unless `email_verified` is false.
    static func verifiedEmail(in userinfo: Data?) -> String? {
        guard let userinfo, let claims = (try? JSONSerialization.jsonObject(with: userinfo)) as? [String: Any],
              let email = claims["email"] as? String, GatehouseConfiguration.isAddress(email) else { return nil }
        if let verified = claims["email_verified"] as? Bool, !verified { return nil }
        return email
    }

    /// `alice@example.com` as `a***@example.com`.
    static func masked(_ email: String) -> String {
        guard let at = email.firstIndex(of: "@") else { return "***" }
        return String(email[..<at].prefix(1)) + "***" + String(email[at...])
    }
}

extension Response {
    /// A 303 to `location` (after a form POST), never cached.
    static func seeOther(_ location: String) -> Response {
        var response = Response.redirect(to: location)
        response.status = .seeOther
        return response
    }
}

/// The certification pages: no script, no frames, nothing cached, every value escaped.
enum CertificationPage {
    enum Form {
        case link(String, String)
        case html(String)
    }

    static func page(title: String, status: HTTPResponse.Status, paragraphs: [String], form: Form?) -> Response {
        let body: String
        switch form {
        case .link(let url, let label)?: body = #"<p><a id="back" href="\#(ErrorPage.escape(url))">\#(ErrorPage.escape(label))</a></p>"#
        case .html(let html)?: body = html
        case nil: body = ""
        }
        let html = """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(ErrorPage.escape(title)) · Gatehouse</title>
            <style>body{font-family:system-ui,sans-serif;max-width:34rem;margin:3rem auto;padding:0 1rem;line-height:1.5}
            input{font-size:1.5rem;letter-spacing:.3rem;width:9rem}button{font-size:1rem;margin-right:1rem}</style></head>
            <body><h1>\(ErrorPage.escape(title))</h1>
            \(paragraphs.map { "<p>" + ErrorPage.escape($0) + "</p>" }.joined(separator: "\n"))
            \(body)
            </body></html>
            """
        var headers = HTTPFields()
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.cacheControl] = "no-store"
        headers[.contentSecurityPolicy] = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
        headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: html)))
    }

    static func codePage(pending: String, maskedEmail: String?, app: String?, notice: String?) -> Response {
        var paragraphs: [String] = []
        if let app, let maskedEmail {
            paragraphs.append("To allow \(app) on this device, enter the 6-digit code we just sent to \(maskedEmail).")
        }
        if let notice { paragraphs.append(notice) }
        return page(title: "Enter your code", status: .ok, paragraphs: paragraphs, form: .html("""
            <form method="post" action="/oauth/certify">
            <input type="hidden" name="pending" value="\(ErrorPage.escape(pending))">
            <p><input id="code" name="code" inputmode="numeric" autocomplete="one-time-code" maxlength="6" required autofocus></p>
            <p><button id="submit" type="submit">Continue</button></p>
            </form>
            """))
    }

    static func allowPage(pending: String, app: String, maskedEmail: String) -> Response {
        page(title: "Allow this app?", status: .ok,
             paragraphs: ["The code is right. Allow \(app) on this device to act for \(maskedEmail)?"],
             form: .html("""
                <form method="post" action="/oauth/certify/allow">
                <input type="hidden" name="pending" value="\(ErrorPage.escape(pending))">
                <button id="allow" type="submit" name="decision" value="allow">Allow this app</button>
                <button id="deny" type="submit" name="decision" value="deny">Don't allow</button>
                </form>
                """))
    }

    static func expired() -> Response {
        page(title: "This sign-in has expired", status: .badRequest,
             paragraphs: ["This sign-in is unknown, expired or already finished. Start again from the app."], form: nil)
    }
}
