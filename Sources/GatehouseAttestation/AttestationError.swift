/// Why an attestation or an assertion was refused, in words safe to show the app that sent it.
public struct AttestationError: Error, Sendable, CustomStringConvertible {
    public let description: String

    public init(_ description: String) { self.description = description }
}
