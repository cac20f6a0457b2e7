/// E-mail addresses as Gatehouse accepts them: valibot's `email()` rule (the central provider's
/// `EMAIL_REGEX`, ASCII word characters), within RFC 5321's 254 characters. An address Gatehouse
/// accepts is one the central provider accepts, and one its mail relay can write to.
public enum EmailAddress {
    public static func isValid(_ text: String) -> Bool {
        guard text.utf8.count <= 254 else { return false }
        return text.wholeMatch(of: pattern) != nil
    }

    nonisolated(unsafe) private static let pattern =
        /[A-Za-z0-9_+\-]+(?:\.[A-Za-z0-9_+\-]+)*@[0-9A-Za-z]+(?:[.\-][0-9A-Za-z]+)*\.[A-Za-z]{2,}/
}
