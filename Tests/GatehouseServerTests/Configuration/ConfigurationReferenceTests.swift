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

    /// The keys of the reference: the first cell of every row of a table headed `key`.
    static func documentedKeys() throws -> Set<String> {
        let text = try String(contentsOf: root.appending(path: "docs/configuration.md"), encoding: .utf8)
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

    @Test func everyAcceptedKeyIsDocumentedAndEveryDocumentedKeyIsAccepted() throws {
        let documented = try Self.documentedKeys()
        let asked = try Self.askedKeys()
        // A mapping that only groups keys (`server`, `clients[].instances`) needs no row of its own.
        let containers = Set(asked.filter { key in asked.contains { $0.hasPrefix(key + ".") || $0.hasPrefix(key + "[]") } })
        let undocumented = asked.subtracting(documented).filter { key in
            if containers.contains(key) { return false }
            // The `{per_second, burst}` shape of a rate is described once, on the rate's own row.
            if let dot = key.lastIndex(of: "."), ["per_second", "burst"].contains(String(key[key.index(after: dot)...])),
               documented.contains(String(key[..<dot])) { return false }
            return true
        }
        #expect(undocumented.isEmpty, "accepted by the decoder, missing from docs/configuration.md: \(undocumented.sorted())")
        let unknown = documented.subtracting(asked)
        #expect(unknown.isEmpty, "in docs/configuration.md, unknown to the decoder (or reached by no document under Tests/Fixtures/configuration): \(unknown.sorted())")
    }

    /// The check itself can fail: a key missing from the reference is found.
    @Test func aKeyMissingFromTheReferenceIsFound() throws {
        let asked = try Self.askedKeys()
        #expect(asked.contains("server.public_base_url"))
        #expect(asked.contains("upstreams[].identity.cache_ttl"))
        #expect(!asked.contains("upstreams[].client_secret"), "a key read only to be refused is no setting")
    }
}
