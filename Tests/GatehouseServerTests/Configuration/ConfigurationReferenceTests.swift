import Foundation
import GatehouseServer
import Testing

/// The configuration reference (docs/configuration.md) and the decoder agree: every key the
/// decoder accepts has its row, and no row names a key the decoder does not know.
///
/// The decoder's side is what it asks for while reading real documents (`keysAsked`): the
/// example files under deploy/ and the documents under Tests/Fixtures/configuration/, which
/// between them reach every mapping and every kind. A key the decoder learns is missing from
/// the reference until documented; a row for a key no document reaches fails until a document
/// reaches it, so the fixtures cannot quietly fall behind the decoder.
struct ConfigurationReferenceTests {
    static let root = URL(filePath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func reference() throws -> String {
        try String(contentsOf: root.appending(path: "docs/configuration.md"), encoding: .utf8)
    }

    /// The keys of the reference `text`: the first cell of every row of a table headed `key`.
    static func documentedKeys(in text: String) -> Set<String> {
        var keys: Set<String> = []
        var inKeyTable = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard trimmed.hasPrefix("|") else { inKeyTable = false; continue }
            let cells = trimmed.split(separator: "|", omittingEmptySubsequences: false).dropFirst().map { $0.trimmingCharacters(in: .whitespaces) }
            guard let first = cells.first else { continue }
            if first == "key" { inKeyTable = true; continue }
            guard inKeyTable, !first.hasPrefix("---") else { continue }
            let match = first.wholeMatch(of: /`([a-z0-9_.\[\]]+)`/)
            #expect(match != nil, "a row of the reference documents one key, written in full: \(first)")
            if let match { keys.insert(String(match.1)) }
        }
        return keys
    }

    static func documents() throws -> [URL] {
        let files = FileManager.default
        let examples = try files.contentsOfDirectory(at: root.appending(path: "deploy"), includingPropertiesForKeys: nil)
            .filter { $0.lastPathComponent.hasSuffix(".example.yaml") }
        let fixtures = try files.contentsOfDirectory(at: root.appending(path: "Tests/Fixtures/configuration"), includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "yaml" }
        return (examples + fixtures).sorted { $0.path < $1.path }
    }

    static func askedKeys() throws -> Set<String> {
        var keys: Set<String> = []
        for document in try documents() {
            let text = try String(contentsOf: document, encoding: .utf8)
            let asked = try #require(YAMLConfigurationLoader.keysAsked(yaml: text, baseDirectory: document.deletingLastPathComponent(), environment: [:]),
                                     "\(document.lastPathComponent) is YAML")
            keys.formUnion(asked)
        }
        return keys
    }

    /// Where a reference and the decoder disagree: keys `asked` for but not `documented`, and
    /// keys `documented` that nothing asked for.
    static func disagreements(documented: Set<String>, asked: Set<String>) -> (undocumented: Set<String>, unknown: Set<String>) {
        // A mapping that only groups keys (`server`, `clients[].instances`) needs no row of its own.
        let containers = Set(asked.filter { key in asked.contains { $0.hasPrefix(key + ".") || $0.hasPrefix(key + "[]") } })
        let undocumented = asked.subtracting(documented).filter { key in
            if containers.contains(key) { return false }
            // The `{per_second, burst}` shape of a rate is described once, on the rate's own row.
            if let dot = key.lastIndex(of: "."), ["per_second", "burst"].contains(String(key[key.index(after: dot)...])),
               documented.contains(String(key[..<dot])) { return false }
            return true
        }
        return (undocumented, documented.subtracting(asked))
    }

    @Test func everyAcceptedKeyIsDocumentedAndEveryDocumentedKeyIsAccepted() throws {
        let (undocumented, unknown) = Self.disagreements(documented: Self.documentedKeys(in: try Self.reference()), asked: try Self.askedKeys())
        #expect(undocumented.isEmpty, "accepted by the decoder, missing from docs/configuration.md: \(undocumented.sorted())")
        #expect(unknown.isEmpty, "in docs/configuration.md, unknown to the decoder (or reached by no document under Tests/Fixtures/configuration): \(unknown.sorted())")
    }

    /// The check itself can fail: the reference with three rows taken out (a top-level setting,
    /// one of each upstream, one of each app's instances) and a row put in for a key nothing
    /// reads disagrees with the decoder on those four keys, and on them only.
    @Test func aKeyMissingFromTheReferenceIsFound() throws {
        let asked = try Self.askedKeys()
        #expect(!asked.contains("upstreams[].client_secret"), "a key read only to be refused is no setting")
        let missing = ["server.public_base_url", "upstreams[].identity.cache_ttl", "clients[].instances.attestation"]
        let reference = try Self.reference()
        var lines = reference.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        for key in missing {
            let row = try #require(lines.firstIndex { $0.hasPrefix("| `\(key)` |") }, "docs/configuration.md has no row for \(key)")
            #expect(asked.contains(key), "\(key) is a setting the decoder reads")
            lines.remove(at: row)
        }
        let anchor = try #require(lines.firstIndex { $0.hasPrefix("| `server.") })
        lines.insert("| `server.no_such_key` | – | a key nothing reads |", at: anchor)
        let (undocumented, unknown) = Self.disagreements(documented: Self.documentedKeys(in: lines.joined(separator: "\n")), asked: asked)
        #expect(undocumented == Set(missing), "\(undocumented.sorted())")
        #expect(unknown == ["server.no_such_key"])
        #expect(Self.disagreements(documented: Self.documentedKeys(in: reference), asked: asked) == (Set(), Set()), "the reference itself agrees")
    }
}
