import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif

/// Reads the text of elements at given paths (`/Envelope/Body/BPId`) with a real XML parser.
///
/// Paths match local names, so namespaces and prefixes do not matter. External entities are
/// never resolved (no XXE). The first occurrence of each path wins.
final class XMLValueReader: NSObject, XMLParserDelegate {
    private let wanted: Set<String>
    private var stack: [String] = []
    private var text = ""
    private(set) var values: [String: String] = [:]

    private init(wanted: Set<String>) {
        self.wanted = wanted
    }

    /// The values found, or `nil` when the document is not well-formed XML.
    static func values(at paths: Set<String>, in data: Data) -> [String: String]? {
        let reader = XMLValueReader(wanted: paths)
        let parser = XMLParser(data: data)
        parser.shouldProcessNamespaces = true
        parser.shouldResolveExternalEntities = false
        parser.delegate = reader
        return parser.parse() ? reader.values : nil
    }

    func parser(_ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?,
                qualifiedName: String?, attributes: [String: String] = [:]) {
        stack.append(elementName.split(separator: ":").last.map(String.init) ?? elementName)
        text = ""
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        text += string
    }

    func parser(_ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName: String?) {
        let path = "/" + stack.joined(separator: "/")
        if wanted.contains(path), values[path] == nil {
            values[path] = text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        stack.removeLast()
        text = ""
    }
}
