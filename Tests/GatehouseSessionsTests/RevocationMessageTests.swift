import GatehouseCore
import GatehouseRelay
@testable import GatehouseSessions
import Logging
import Synchronization
import Testing

/// What one instance tells the others when it revokes something (a PostgreSQL `NOTIFY` payload):
/// read back exactly as written, never carrying a token, and anything else is not a message.
struct RevocationMessageTests {
    static let key = TokenKey(token: "upstream-access-token", upstream: "legacy")

    @Test func aMessageIsReadBackAsItWasWritten() {
        for message in [RevocationMessage.session("s-1234"), .session("an id with spaces"), .identity(Self.key)] {
            #expect(RevocationMessage(message.text) == message)
        }
    }

    @Test func anIdentityMessageCarriesTheKeysHashNeverTheToken() {
        let text = RevocationMessage.identity(Self.key).text
        #expect(text == "identity " + Self.key.hex)
        #expect(!text.contains("upstream-access-token"))
        #expect(Self.key.hex.count == 64)
    }

    @Test(arguments: [
        "", "session", "session ", "identity", "identity ", "session:s-1", "SESSION s-1", "token s-1", "refresh upstream-rt",
        "identity " + String(repeating: "0", count: 63),  // too short
        "identity " + String(repeating: "0", count: 65),  // too long
        "identity " + String(repeating: "g", count: 64),  // not hex
        "identity " + String(repeating: "A", count: 64),  // hex, but not as Gatehouse writes it
        "identity " + key.hex + " ",
    ])
    func anythingElseIsNotAMessage(text: String) {
        #expect(RevocationMessage(text) == nil)
    }

    @Test func announcingSendsTheMessagesText() async {
        let announcer = RecordingAnnouncer()
        await announcer.announce(.session("s-1"), logger: Logger(label: "test"))
        await announcer.announce(.identity(Self.key), logger: Logger(label: "test"))
        #expect(announcer.sent == ["session s-1", "identity " + Self.key.hex])
    }

    @Test func anAnnouncementThatFailsIsLoggedNotThrown() async {
        let announcer = RecordingAnnouncer(failing: true)
        let log = RecordedLog()
        await announcer.announce(.session("s-1"), logger: log.logger)
        #expect(announcer.sent.isEmpty)
        #expect(log.entries.map(\.level) == [.warning])
        #expect(log.entries.allSatisfy { !$0.message.contains("s-1") })
    }
}

/// A store's announcer that records what it was asked to send, or fails.
final class RecordingAnnouncer: RevocationAnnouncer {
    struct Unreachable: Error {}
    private let messages = Mutex<[String]>([])
    let failing: Bool

    init(failing: Bool = false) { self.failing = failing }

    var sent: [String] { messages.withLock { $0 } }

    func announceRevocation(_ message: String) async throws {
        if failing { throw Unreachable() }
        messages.withLock { $0.append(message) }
    }
}
