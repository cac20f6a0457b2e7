/// A secret value that never prints itself.
///
/// `description`, `debugDescription` and string interpolation all show `<redacted>`, so a
/// secret that reaches a log line, an error or a response by mistake shows nothing.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    private let value: String

    public init(_ value: String) { self.value = value }

    /// The secret itself, for the one place that must send it (the upstream token request).
    public func reveal() -> String { value }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
}

