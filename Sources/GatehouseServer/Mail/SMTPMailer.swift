import Foundation
import GatehouseCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL

/// One e-mail: plain text, to one address.
struct MailMessage: Sendable {
    let to: String
    let subject: String
    let body: String
}

/// Sends e-mail; the SMTP relay in production, a recorder in tests.
protocol Mailer: Sendable {
    func send(_ message: MailMessage) async throws
}

/// Why a delivery failed, without a word of the message (the code in it is a secret).
struct MailError: Error, CustomStringConvertible {
    let description: String
}

/// A small SMTP client (RFC 5321) over SwiftNIO and NIOSSL: no Swift SMTP package is in the
/// mirror. EHLO, STARTTLS (RFC 3207) then EHLO again, AUTH PLAIN (RFC 4616) when configured and
/// only inside TLS, MAIL FROM, RCPT TO, DATA with dot-stuffing, QUIT; the whole delivery within
/// `mail.timeout`.
struct SMTPMailer: Mailer {
    let settings: MailSettings
    let logger: Logger

    func send(_ message: MailMessage) async throws {
        guard GatehouseConfiguration.isAddress(message.to) else { throw MailError(description: "the recipient is not a plain e-mail address") }
        let data = try SMTPMessage.data(message, from: settings.from, date: Date(), messageID: SecureToken.generate().prefix(24) + "@gatehouse")
        try await withDeadline(settings.timeout, orThrow: { MailError(description: "the SMTP relay did not finish within the timeout") }) {
            try await deliver(data, to: message.to)
        }
    }

    private func deliver(_ data: String, to recipient: String) async throws {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(5))
            .connect(host: settings.host, port: settings.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let settings = self.settings
        let heloName = "gatehouse.invalid"
        try await channel.executeThenClose { inbound, outbound in
            var replies = SMTPReplyReader(inbound.makeAsyncIterator())
            func command(_ line: String, expect codes: Set<Int>) async throws -> SMTPReply {
                try await outbound.write(ByteBuffer(string: line + "\r\n"))
                let reply = try await replies.next()
                guard codes.contains(reply.code) else {
                    // The verb only: a command line may hold an address or credentials.
                    let verb = line.split(separator: " ").first.map(String.init) ?? "?"
                    throw MailError(description: "the SMTP relay answered \(reply.code) to \(verb)")
                }
                return reply
            }
            let greeting = try await replies.next()
            guard greeting.code == 220 else { throw MailError(description: "the SMTP relay greeted with \(greeting.code)") }
            var capabilities = try await command("EHLO \(heloName)", expect: [250])
            if settings.startTLS {
                guard capabilities.lines.contains(where: { $0.uppercased().hasPrefix("STARTTLS") }) else {
                    throw MailError(description: "the SMTP relay does not offer STARTTLS")
                }
                _ = try await command("STARTTLS", expect: [220])
                var tls = TLSConfiguration.makeClientConfiguration()
                if let pem = settings.trustRootsPEM {
                    tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))
                }
                let context = try NIOSSLContext(configuration: tls)
                // An IP address is checked against the certificate's IP addresses, never sent as SNI.
                let isAddress = (try? SocketAddress(ipAddress: settings.host, port: 0)) != nil
                let handler = try NIOSSLClientHandler(context: context, serverHostname: isAddress ? nil : settings.host)
                try await channel.channel.pipeline.addHandler(handler, position: .first).get()
                capabilities = try await command("EHLO \(heloName)", expect: [250])
            }
            if let username = settings.username, let password = settings.password {
                let credentials = Data(("\0" + username + "\0" + password.reveal()).utf8).base64EncodedString()
                _ = try await command("AUTH PLAIN \(credentials)", expect: [235])
            }
            _ = capabilities
            _ = try await command("MAIL FROM:<\(settings.from)>", expect: [250])
            _ = try await command("RCPT TO:<\(recipient)>", expect: [250, 251])
            _ = try await command("DATA", expect: [354])
            _ = try await command(data + ".", expect: [250])
            try? await outbound.write(ByteBuffer(string: "QUIT\r\n"))
        }
        logger.info("mail delivered through the SMTP relay")
    }
}

/// One SMTP reply: its code and its lines' texts (RFC 5321 §4.2).
struct SMTPReply: Equatable {
    let code: Int
    let lines: [String]
}

/// Reads whole replies from the byte stream: lines `ddd-text` continue, `ddd text` ends one.
struct SMTPReplyReader<Iterator: AsyncIteratorProtocol> where Iterator.Element == ByteBuffer {
    private var iterator: Iterator
    private var pending: [UInt8] = []

    init(_ iterator: Iterator) {
        self.iterator = iterator
    }

    mutating func next() async throws -> SMTPReply {
        var lines: [String] = []
        while true {
            let line = try await nextLine()
            guard let parsed = SMTPReplyLine(line) else { throw MailError(description: "the SMTP relay sent a malformed reply") }
            lines.append(parsed.text)
            guard lines.count <= 100 else { throw MailError(description: "the SMTP relay sent too long a reply") }
            if parsed.isLast { return SMTPReply(code: parsed.code, lines: lines) }
        }
    }

    private mutating func nextLine() async throws -> String {
        while true {
            if let end = pending.firstIndex(of: UInt8(ascii: "\n")) {
                var line = Array(pending[..<end])
                pending.removeFirst(end + 1)
                if line.last == UInt8(ascii: "\r") { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard pending.count < 4096 else { throw MailError(description: "the SMTP relay sent too long a line") }
            guard var buffer = try await iterator.next() else { throw MailError(description: "the SMTP relay closed the connection") }
            pending += buffer.readBytes(length: buffer.readableBytes) ?? []
        }
    }
}

/// One line of a reply: three digits, then `-` (more follow) or a space (the last), then text.
struct SMTPReplyLine: Equatable {
    let code: Int
    let isLast: Bool
    let text: String

    init?(_ line: String) {
        let bytes = Array(line.utf8)
        guard bytes.count >= 3, bytes[0...2].allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
              let code = Int(String(decoding: bytes[0...2], as: UTF8.self)), (200...599).contains(code) else { return nil }
        if bytes.count == 3 {
            (self.code, isLast, text) = (code, true, "")
            return
        }
        guard bytes[3] == UInt8(ascii: " ") || bytes[3] == UInt8(ascii: "-") else { return nil }
        (self.code, isLast, text) = (code, bytes[3] == UInt8(ascii: " "), String(decoding: bytes[4...], as: UTF8.self))
    }
}

/// The DATA of a message (RFC 5322): headers, a blank line, the body with CRLF line ends and
/// dot-stuffing (RFC 5321 §4.5.2), ending with CRLF (the caller adds the final `.`).
enum SMTPMessage {
    static func data(_ message: MailMessage, from: String, date: Date, messageID: some StringProtocol) throws -> String {
        for field in [message.to, from, message.subject] where field.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw MailError(description: "a header of the message holds a control character")
        }
        guard GatehouseConfiguration.isAddress(from), GatehouseConfiguration.isAddress(message.to) else {
            throw MailError(description: "an address of the message is not a plain e-mail address")
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss '+0000'"
        var lines = [
            "Date: \(formatter.string(from: date))",
            "From: <\(from)>",
            "To: <\(message.to)>",
            "Subject: \(message.subject)",
            "Message-ID: <\(messageID)>",
            "MIME-Version: 1.0",
            "Content-Type: text/plain; charset=utf-8",
            "Content-Transfer-Encoding: 8bit",
            "",
        ]
        let body = message.body.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
        for line in body.split(separator: "\n", omittingEmptySubsequences: false) {
            lines.append(line.hasPrefix(".") ? "." + line : String(line))
        }
        return lines.joined(separator: "\r\n") + "\r\n"
    }
}
