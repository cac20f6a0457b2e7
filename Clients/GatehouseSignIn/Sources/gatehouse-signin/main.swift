// gatehouse-signin: a line-oriented driver of GatehouseSignIn, what an app's screens would call.
//
//   gatehouse-signin --issuer URL --client-id ID [--scope S] [--redirect-uri U] [--dpop]
//
// Reads one JSON object per line on stdin, `{"call": "<method>", ...}`, calls that method of
// InAppSignIn and prints exactly one JSON line on stdout:
//
//   {"state": "<name>", "states": [every state entered during the call], "error": "<code>" | null,
//    "retry_after": N (too_many_requests with a delay), "url": "…" (fallbackInBrowser),
//    "code_verifier": "…" (fallbackInBrowser), "tokens": {…} (finalize: the token endpoint's JSON),
//    "dpop_jkt": "…" (with --dpop)}
//
// Calls: start; checkAccount {email}; setPassword {password}; signIn; verifyUnblockCode {code};
// resendUnblockCodeEmail; verifySessionTotpCode {code}; verifySessionEmailCode {code};
// resendVerificationSessionCodeEmail; reset. A line that is not such a call answers the error
// "invalid_call". Blank lines are skipped; the driver exits 0 at the end of its input.
// Diagnostics go to stderr and never repeat a line of input (it may hold a password or a code).

import Foundation
import GatehouseSignIn
import Synchronization

struct Options {
    var issuer: URL
    var clientID: String
    var scope: String?
    var redirectURI: URL?
    var dpop = false
}

let usage = "usage: gatehouse-signin --issuer URL --client-id ID [--scope S] [--redirect-uri U] [--dpop]"

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("gatehouse-signin: \(message)\n\(usage)\n".utf8))
    exit(2)
}

func parseOptions(_ arguments: [String]) -> Options {
    var values: [String: String] = [:]
    var dpop = false
    var index = 0
    while index < arguments.count {
        var name = arguments[index]
        var value: String?
        if let equals = name.firstIndex(of: "="), name.hasPrefix("--") {
            value = String(name[name.index(after: equals)...])
            name = String(name[..<equals])
        }
        switch name {
        case "--help", "-h":
            print(usage)
            exit(0)
        case "--dpop":
            guard value == nil else { fail("--dpop takes no value") }
            dpop = true
        case "--issuer", "--client-id", "--scope", "--redirect-uri":
            if value == nil {
                index += 1
                guard index < arguments.count else { fail("\(name) needs a value") }
                value = arguments[index]
            }
            values[name] = value
        default:
            fail("unknown argument \(name)")
        }
        index += 1
    }
    guard let issuerText = values["--issuer"], let issuer = URL(string: issuerText), issuer.host != nil else {
        fail("--issuer URL is required")
    }
    guard let clientID = values["--client-id"], !clientID.isEmpty else { fail("--client-id ID is required") }
    var redirectURI: URL?
    if let text = values["--redirect-uri"] {
        guard let url = URL(string: text), url.scheme != nil else { fail("--redirect-uri is not a URL") }
        redirectURI = url
    }
    return Options(issuer: issuer, clientID: clientID, scope: values["--scope"], redirectURI: redirectURI, dpop: dpop)
}

/// The states entered during one call.
final class StateLog: Sendable {
    private let names = Mutex<[String]>([])

    func append(_ state: SignInState) { names.withLock { $0.append(state.name) } }

    func take() -> [String] { names.withLock { names in defer { names.removeAll() }; return names } }
}

/// One output line (its members sorted by name).
struct Report: Encodable {
    var state: String
    var states: [String]
    var error: String?
    var retryAfter: Int?
    var url: String?
    var codeVerifier: String?
    var tokens: [String: JSONValue]?
    var dpopJKT: String?

    enum CodingKeys: String, CodingKey {
        case state, states, error, retryAfter = "retry_after", url, codeVerifier = "code_verifier", tokens, dpopJKT = "dpop_jkt"
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(state, forKey: .state)
        try container.encode(states, forKey: .states)
        try container.encode(error, forKey: .error)  // null when the call went well
        try container.encodeIfPresent(retryAfter, forKey: .retryAfter)
        try container.encodeIfPresent(url, forKey: .url)
        try container.encodeIfPresent(codeVerifier, forKey: .codeVerifier)
        try container.encodeIfPresent(tokens, forKey: .tokens)
        try container.encodeIfPresent(dpopJKT, forKey: .dpopJKT)
    }
}

enum DriverError: Error {
    case invalidCall
}

let options = parseOptions(Array(CommandLine.arguments.dropFirst()))
let dpopKey = options.dpop ? DPoPKey() : nil
let log = StateLog()
let client: InAppSignIn
do {
    client = try InAppSignIn(issuer: options.issuer, clientID: options.clientID, scope: options.scope, dpopKey: dpopKey,
                             redirectURI: options.redirectURI, onStateChange: { state, _ in log.append(state) })
} catch {
    fail("\(error)")
}

let encoder = JSONEncoder()
encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]

func emit(_ report: Report) {
    var data = (try? encoder.encode(report)) ?? Data(#"{"state":null,"states":[],"error":"unexpected"}"#.utf8)
    data.append(UInt8(ascii: "\n"))
    FileHandle.standardOutput.write(data)  // unbuffered: the line is out when this returns
}

/// Runs one call; the error it ended with (nil when it went well).
func perform(_ call: [String: Any]) async throws -> SignInError? {
    func text(_ name: String) throws -> String {
        guard let value = call[name] as? String else { throw DriverError.invalidCall }
        return value
    }
    guard let name = call["call"] as? String else { throw DriverError.invalidCall }
    switch name {
    case "start": try await client.start()
    case "checkAccount": try await client.checkAccount(try text("email"))
    case "setPassword":
        try await client.setPassword(try text("password"))
        return nil
    case "signIn": try await client.signIn()
    case "verifyUnblockCode": try await client.verifyUnblockCode(try text("code"))
    case "resendUnblockCodeEmail": try await client.resendUnblockCodeEmail()
    case "verifySessionTotpCode": try await client.verifySessionTotpCode(try text("code"))
    case "verifySessionEmailCode": try await client.verifySessionEmailCode(try text("code"))
    case "resendVerificationSessionCodeEmail": try await client.resendVerificationSessionCodeEmail()
    case "reset":
        try await client.reset()
        return nil
    default: throw DriverError.invalidCall
    }
    return await client.lastError
}

while let line = readLine(strippingNewline: true) {
    guard !line.allSatisfy(\.isWhitespace) else { continue }
    var errorCode: String?
    var retryAfter: Int?
    do {
        guard let call = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
            throw DriverError.invalidCall
        }
        if let error = try await perform(call) {
            errorCode = error.code
            retryAfter = error.retryAfter
        }
    } catch let error as SignInError {
        errorCode = error.code
    } catch {
        FileHandle.standardError.write(Data("gatehouse-signin: a line is not a known call with its members\n".utf8))
        errorCode = "invalid_call"
    }
    let state = await client.state
    var report = Report(state: state.name, states: log.take(), error: errorCode, retryAfter: retryAfter, dpopJKT: dpopKey?.thumbprint)
    switch state {
    case .finalize(let tokens):
        report.tokens = tokens.raw
    case .fallbackInBrowser(let url):
        report.url = url.absoluteString
        report.codeVerifier = await client.browserSignIn?.codeVerifier
    default:
        break
    }
    emit(report)
}
exit(0)
