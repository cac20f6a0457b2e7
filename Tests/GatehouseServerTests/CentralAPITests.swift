import Foundation
@testable import GatehouseServer
import Testing

/// The pure parts of the seed's `/auth/*` face: the per-address magic-link window and the e-mail rule.
struct CentralAPITests {
    @Test func theSixthMagicLinkWithinTheHourIsRefusedUntilTheFirstAges() {
        let limiter = MagicLinkLimiter(limit: 5)
        let start = Date(timeIntervalSince1970: 1_764_000_000)
        for minute in 0..<5 {
            #expect(limiter.admit("Zoe@Example.test", now: start.addingTimeInterval(Double(minute) * 60)) == nil)
        }
        // The same address in another case counts with it; another address does not.
        #expect(limiter.admit(" zoe@example.TEST", now: start.addingTimeInterval(600)) == 3000)
        #expect(limiter.admit("other@example.test", now: start.addingTimeInterval(600)) == nil)
        // Once the first send is an hour old, one more is allowed, and only one.
        #expect(limiter.admit("zoe@example.test", now: start.addingTimeInterval(3600)) == nil)
        #expect(limiter.admit("zoe@example.test", now: start.addingTimeInterval(3601)) == 59)
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
