/// E-mail addresses as Gatehouse accepts them: valibot's `email()` rule (ASCII word characters,
/// a dotted domain with a 2-letter or longer top level), within RFC 5321's 254 characters. Every
/// face that takes an address uses this one rule, so an address one accepts the others accept,
/// and Gatehouse's mail relay can write to it.
public enum EmailAddress {
    public static func isValid(_ text: String) -> Bool {
        guard text.utf8.count <= 254 else { return false }
        return text.wholeMatch(of: pattern) != nil
    }

    nonisolated(unsafe) private static let pattern =
        /[A-Za-z0-9_+\-]+(?:\.[A-Za-z0-9_+\-]+)*@[0-9A-Za-z]+(?:[.\-][0-9A-Za-z]+)*\.[A-Za-z]{2,}/
}
