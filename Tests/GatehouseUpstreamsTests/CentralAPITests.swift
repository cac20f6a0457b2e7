import Foundation
@testable import GatehouseUpstreams
import Testing

/// The pure parts of the seed's `/auth/*` face: the magic-link windows (per mailbox, per client address) and the e-mail rule.
struct CentralAPITests {
    @Test func theSixthMagicLinkWithinTheHourIsRefusedUntilTheFirstAges() {
        let limiter = MagicLinkLimiter(mailboxLimit: 5, addressLimit: 1000)
        let start = Date(timeIntervalSince1970: 1_764_000_000)
        for minute in 0..<5 {
            #expect(limiter.admit("Zoe@Example.test", clientAddress: "192.0.2.1", now: start.addingTimeInterval(Double(minute) * 60)) == nil)
        }
        // The same address in another case counts with it; another address does not.
        #expect(limiter.admit(" zoe@example.TEST", clientAddress: "192.0.2.1", now: start.addingTimeInterval(600))
            == .init(limit: .mailbox, retryAfter: 3000))
        #expect(limiter.admit("other@example.test", clientAddress: "192.0.2.1", now: start.addingTimeInterval(600)) == nil)
        // Once the first send is an hour old, one more is allowed, and only one.
        #expect(limiter.admit("zoe@example.test", clientAddress: nil, now: start.addingTimeInterval(3600)) == nil)
        #expect(limiter.admit("zoe@example.test", clientAddress: nil, now: start.addingTimeInterval(3601))?.retryAfter == 59)
    }

    @Test(arguments: [
        ("Victim@Example.test", "victim@example.test"), ("victim+1@example.test", "victim@example.test"),
        ("victim+a+b@example.test", "victim@example.test"), ("vic.tim@example.test", "vic.tim@example.test"),
        ("Vic.Tim+x@GMail.com", "victim@gmail.com"), ("v.i.c.t.i.m@googlemail.com", "victim@gmail.com"),
        ("victim@gmail.com.example", "victim@gmail.com.example"),
    ])
    func aMailboxIsCountedWithoutCaseTagsOrGmailDots(address: String, mailbox: String) {
        #expect(MagicLinkLimiter.mailbox(of: address) == mailbox)
    }

    @Test func sixteenSpellingsOfOneMailboxFromOneAddressStopAtTheMailboxLimit() {
        let limiter = MagicLinkLimiter(mailboxLimit: 5, addressLimit: 1000)
        let now = Date(timeIntervalSince1970: 1_764_000_000)
        let spellings = (1...8).map { "victim+\($0)@gmail.com" } + ["vic.tim@gmail.com", "v.ictim@googlemail.com", "VICTIM@gmail.com",
                                                                   "victim@googlemail.com", "vi.c.tim+x@gmail.com", "Victim+y@GoogleMail.com",
                                                                   "v.i.c.t.i.m@gmail.com", "victim+z@gmail.com"]
        #expect(Set(spellings).count == 16)
        let admitted = spellings.filter { limiter.admit($0, clientAddress: "192.0.2.7", now: now) == nil }
        #expect(admitted.count == 5)
    }

    @Test func oneClientAddressIsLimitedWhateverTheMailboxes() {
        let limiter = MagicLinkLimiter(mailboxLimit: 5, addressLimit: 3)
        let now = Date(timeIntervalSince1970: 1_764_000_000)
        for index in 0..<3 { #expect(limiter.admit("person\(index)@example.test", clientAddress: "192.0.2.9", now: now) == nil) }
        #expect(limiter.admit("person3@example.test", clientAddress: "192.0.2.9", now: now)?.limit == .address)
        // Another client address still may, and the refused send charged no mailbox.
        #expect(limiter.admit("person3@example.test", clientAddress: "192.0.2.10", now: now) == nil)
        for host in 11...14 { #expect(limiter.admit("person3@example.test", clientAddress: "192.0.2.\(host)", now: now) == nil) }
        #expect(limiter.admit("person3@example.test", clientAddress: "192.0.2.15", now: now)?.limit == .mailbox)
    }

    @Test(arguments: [
        ("zoe@example.test", true), ("first.last+tag@sub.example.co", true), ("a_b-c@x-y.example.org", true),
        ("zoe@localhost", false), ("zoe@@example.test", false), ("zo e@example.test", false), ("@example.test", false),
        ("zoe@example.t", false), ("zoé@example.test", false), ("zoe@exa_mple.test", false), (".zoe@example.test", false),
    ])
    func addressesAreCheckedAsTheProviderChecksThem(address: String, accepted: Bool) {
        #expect(CentralAPIRequest.isEmail(address) == accepted)
    }
}
