import Foundation
import GatehouseRelay
@testable import GatehouseServer
import Testing

/// The small pure parts of issue 13: SMTP replies and messages, `return_to`, the session cookie
/// on its way to a backend, and the e-mailed code.
struct TrustedInstanceUnitTests {
    @Test func smtpReplyLinesAreParsed() {
        let continued = SMTPReplyLine("250-STARTTLS")
        #expect(continued?.code == 250 && continued?.isLast == false && continued?.text == "STARTTLS")
        #expect(SMTPReplyLine("250 OK")?.isLast == true)
        #expect(SMTPReplyLine("220")?.code == 220)
        for bad in ["", "25", "abc ok", "250_x", "999 no", "100 low"] { #expect(SMTPReplyLine(bad) == nil, "\(bad)") }
    }

    @Test func aMessageIsDotStuffedWithCRLFAndRefusesHeaderInjection() throws {
        let data = try SMTPMessage.data(MailMessage(to: "alice@example.com", subject: "Code", body: "line\n.starts with a dot\r\nend"),
                                        from: "gh@example.com", date: Date(timeIntervalSince1970: 0), messageID: "id@gatehouse")
        #expect(data.hasPrefix("Date: Thu, 01 Jan 1970 00:00:00 +0000\r\nFrom: <gh@example.com>\r\nTo: <alice@example.com>\r\n"))
        #expect(data.hasSuffix("\r\n\r\nline\r\n..starts with a dot\r\nend\r\n"))
        #expect(!data.replacingOccurrences(of: "\r\n", with: "").contains("\n"))
        #expect(throws: MailError.self) {
            try SMTPMessage.data(MailMessage(to: "alice@example.com\r\nBcc: eve@example.com", subject: "x", body: ""), from: "gh@example.com",
                                 date: Date(), messageID: "id")
        }
        #expect(throws: MailError.self) {
            try SMTPMessage.data(MailMessage(to: "alice@example.com", subject: "x\nBcc: eve@example.com", body: ""), from: "gh@example.com",
                                 date: Date(), messageID: "id")
        }
    }

    @Test func theCodeHasSixDigitsAndItsHashNeedsThePendingID() {
        let codes = (0..<200).map { _ in AppInstances.sixDigits() }
        #expect(codes.allSatisfy { $0.count == 6 && $0.allSatisfy(\.isNumber) })
        #expect(Set(codes).count > 150)
        #expect(AppInstances.codeHash(pending: "p1", code: "123456") != AppInstances.codeHash(pending: "p2", code: "123456"))
        #expect(AppInstances.masked("alice@example.com") == "a***@example.com")
        #expect(AppInstances.verifiedEmail(in: Data(#"{"email":"a@b.co","email_verified":false}"#.utf8)) == nil)
        #expect(AppInstances.verifiedEmail(in: Data(#"{"email":"a@b.co"}"#.utf8)) == "a@b.co")
    }

    @Test(arguments: [
        ("https://app.example.com/inbox?x=1", true), ("https://APP.example.com:443/", true), ("https://app.example.com", true),
        ("https://evil.example.com/", false), ("https://app.example.com@evil.com/", false), ("//evil.com/", false),
        ("https://app.example.com\\@evil.com", false), ("javascript:alert(1)", false), ("http://app.example.com/", false),
        ("https://app.example.com:8443/", false), ("/inbox", false), ("https://app.example.com//evil.com", false),
    ])
    func returnToMustBeUnderAConfiguredOrigin(_ returnTo: String, _ accepted: Bool) {
        #expect((SealedSessions.webDestination(returnTo, origins: ["https://app.example.com"]) != nil) == accepted)
    }

    @Test func theSessionCookieNeverReachesABackend() {
        #expect(RelayHeaderPolicy.withoutSessionCookie("a=1; __Host-gatehouse-session=ghc_x; b=2") == "a=1; b=2")
        #expect(RelayHeaderPolicy.withoutSessionCookie("__Host-gatehouse-session=ghc_x") == nil)
        #expect(RelayHeaderPolicy.sessionCookie(in: ["a=1; __Host-gatehouse-session=ghc_x"]) == "ghc_x")
        #expect(RelayHeaderPolicy.sessionCookie(in: ["__Host-gatehouse-session=a", "__Host-gatehouse-session=b"]) == nil)
    }
}
