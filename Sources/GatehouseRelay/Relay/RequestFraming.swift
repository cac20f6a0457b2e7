public import GatehouseCore

/// How a request head frames its body and what it expects, read one way for the connection's
/// edge (every request) and the relay's admission (relayed ones): RFC 9112 §6.1 for
/// `Transfer-Encoding`, RFC 9110 §10.1.1 for `Expect`. Values are taken as sent, all of a
/// field's lines together.
public enum RequestFraming {
    /// Whether the body is chunked (`false`: no `Transfer-Encoding`), or why the request is
    /// refused: a coding after `chunked` leaves the length unknown (400); a coding before it is
    /// one Gatehouse does not implement (501).
    public static func isChunked(transferEncoding values: [String]) -> Result<Bool, GatehouseProblem> {
        guard !values.isEmpty else { return .success(false) }
        let codings = values.flatMap { $0.split(separator: ",") }.map { trimmed($0).lowercased() }
        guard codings.last == "chunked" else {
            return .failure(.badRequest("The body's length cannot be determined: chunked must be the last transfer coding."))
        }
        guard codings.count == 1 else { return .failure(.notImplemented("Gatehouse takes no transfer coding but chunked.")) }
        return .success(true)
    }

    /// Whether the client waits for `100 Continue`, or 417 for any other expectation. An
    /// HTTP/1.0 client cannot wait for it: its `Expect` is ignored.
    public static func expectsContinue(expect values: [String], isHTTP11: Bool = true) -> Result<Bool, GatehouseProblem> {
        guard !values.isEmpty, isHTTP11 else { return .success(false) }
        guard values.count == 1, trimmed(values[0][...]).lowercased() == "100-continue" else { return .failure(.expectationFailed()) }
        return .success(true)
    }

    /// `value` without the spaces and tabs around it (RFC 9110 §5.6.1 `OWS`).
    static func trimmed(_ value: Substring) -> Substring {
        var slice = value
        while slice.first == " " || slice.first == "\t" { slice = slice.dropFirst() }
        while slice.last == " " || slice.last == "\t" { slice = slice.dropLast() }
        return slice
    }
}
