import Foundation
import GatehouseCore
import GatehouseRelay
import Testing

/// The request target toward the backend: built from the app's raw bytes, never decoded and
/// encoded again, and refused when it cannot be carried faithfully (issue: `%ff` escaped to `/`).
struct RelayTargetTests {
    static func target(_ raw: String, prefix: String = "/api/contracts", backendPath: String = "/contracts") -> String? {
        try? RelayTarget.make(rawTarget: raw, prefix: prefix, backendPath: backendPath).get().target
    }

    @Test(arguments: [
        ("/api/contracts", "/contracts"),
        ("/api/contracts/", "/contracts/"),
        ("/api/contracts/42/lines?from=2026-01", "/contracts/42/lines?from=2026-01"),
        ("/api/contracts/%21%24%3B", "/contracts/%21%24%3B"),
        ("/api/contracts/caf%C3%A9", "/contracts/caf%C3%A9"),
        ("/api/contracts/a;v=1/b", "/contracts/a;v=1/b"),
        ("/api/contracts/...", "/contracts/..."),
        ("/api/contracts/a..b", "/contracts/a..b"),
        ("/api/contracts/x?q=%ff&a=/b?c", "/contracts/x?q=%ff&a=/b?c"),
        ("/api/contracts/x?", "/contracts/x?"),
    ])
    func acceptedTargetsAreCarriedByteForByte(raw: String, expected: String) {
        #expect(Self.target(raw) == expected)
    }

    @Test func anEmptyBackendPathStillSendsAPath() {
        #expect(Self.target("/api/contracts", backendPath: "") == "/")
        #expect(Self.target("/api/contracts/x?y", backendPath: "") == "/x?y")
        #expect(Self.target("/api/x", prefix: "/api/", backendPath: "/b") == "/b/x")
    }

    @Test(arguments: [
        "/api/contracts/%ff?x=1&admin=true",   // invalid UTF-8: AsyncHTTPClient sent this to "/"
        "/api/contracts/%c0%ae%c0%ae/admin",   // overlong '.'
        "/api/contracts/%e0%80%af",            // overlong '/'
        "/api/contracts/%ed%a0%80",            // surrogate
        "/api/contracts/%80",                  // lone continuation byte
        "/api/contracts/%f4%90%80%80",         // past U+10FFFF
        "/api/contracts/%61dmin", "/api/contracts/%7e", "/api/contracts/a%2Db",  // needless encoding: a backend may decode it
        "/api/contracts/a%00b",                // NUL
        "/api/contracts/a%0d%0aX-Injected:1",  // CR LF
        "/api/contracts/a%7f",
        "/api/contracts/%zz", "/api/contracts/%4", "/api/contracts/a%",
        "/api/contracts/..", "/api/contracts/../admin", "/api/contracts/./x", "/api/contracts/%2e%2E/admin",
        "/api/contracts/.%2e/admin", "/api/contracts/..;/admin", "/api/contracts/..;jsessionid=1/admin",
        "/api/contracts/%2e%2e;x/admin", "/api/contracts/.;x", "/api/contracts/;x/admin",
        "/api/contracts//admin", "/api/contracts/a//b",
        "/api/contracts/a%2fb", "/api/contracts/a%2Fb", "/api/contracts/a%5cb", "/api/contracts/a\\b",
        "/api/contracts/a b", "/api/contracts/a#frag", "/api/contracts/a|b", "/api/contracts/{x}", "/api/contracts/\u{e9}",
        "/api/contracts/x?a b", "/api/contracts/x?a=%g1", "/api/contracts/x?a#b", "/api/contracts/x?a=\u{1}",
        "/api/contractsX", "/other/contracts",
    ])
    func targetsThatCannotBeCarriedFaithfullyAreRefused(raw: String) {
        #expect(Self.target(raw) == nil, "\(raw)")
    }

    @Test func refusalsSayWhy() throws {
        let refusal = try #require(RelayTarget.make(rawTarget: "/api/contracts/%ff", prefix: "/api/contracts", backendPath: "")
            .mapError { $0 }.failureValue)
        #expect(refusal.description == "The path does not decode to valid UTF-8")
    }

    /// Every accepted target, of a few thousand generated ones, starts with the backend path
    /// followed by `/`, `?` or nothing, and is exactly the backend path plus the raw rest.
    @Test func noGeneratedTargetLeavesTheBackendPath() {
        let pieces = ["a", "b", "..", ".", "%2e", "%2E", "%2f", "%5c", "%ff", "%c3%a9", "%c0%ae", "%00", "%41", ";", ";x=1",
                      "/", "//", "?", "?q=1", "&", "=", "~", "%", "%4", "%zz", "\\", " ", "#", "@", ":", "caf%C3%A9", "%e2%82%ac"]
        var generator = SplitMix64(seed: 7)
        var accepted = 0
        for _ in 0..<5000 {
            var rest = "/"
            for _ in 0..<Int(generator.next() % 6) { rest += pieces[Int(generator.next() % UInt64(pieces.count))] }
            let raw = "/api/contracts" + rest
            guard let target = Self.target(raw) else { continue }
            accepted += 1
            #expect(target == "/contracts" + raw.dropFirst("/api/contracts".count), "\(raw)")
            let path = target.prefix { $0 != "?" }
            #expect(path == "/contracts" || path.hasPrefix("/contracts/"), "\(raw)")
            var segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst(2)
            if segments.last == "" { segments = segments.dropLast() }  // a trailing slash
            for segment in segments {
                let base = segment.split(separator: ";", omittingEmptySubsequences: false)[0]
                    .replacingOccurrences(of: "%2e", with: ".", options: .caseInsensitive)
                #expect(!["", ".", ".."].contains(base), "\(raw)")
            }
        }
        #expect(accepted > 500)
    }
}

/// A small deterministic generator (SplitMix64), so a failing case can be replayed.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension Result {
    var failureValue: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
