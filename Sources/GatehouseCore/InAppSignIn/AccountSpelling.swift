import Foundation

/// The one form every spelling of an account is counted under.
///
/// An upstream may compare logins far more loosely than byte for byte: MySQL's default collation
/// (`utf8mb4_0900_ai_ci`), SQL Server's `CI_AI` collations and ICU's nondeterministic collations
/// ignore case, accents and default-ignorable code points. Any spelling such an upstream takes
/// for the account must meet the account's counters, or an attacker gets fresh limits by typing
/// `vïctim`, `vi\u{200B}ctim` or `vıctim`. The login is relayed as typed; only the counters' key
/// is folded, further than any of these collations folds (accent- and case-insensitive at the
/// primary strength of the Unicode Collation Algorithm):
///
/// 1. compatibility decomposition (NFKD: full-width, ligatures, the Kelvin sign);
/// 2. combining marks (general categories Mn, Mc, Me) and default-ignorable code points (zero-width
///    space and joiners, soft hyphen, invisible operators, variation selectors, tags) removed, and
///    every other format character (Cf) and control character (Cc) with them;
/// 3. full case folding, written as upper then lower case: `ß` and `ẞ` become `ss`, `ı` and `İ`
///    become `i`, `ς` becomes `σ`, `ſ` becomes `s`;
/// 4. the letters the collation algorithm weighs as a base letter with a secondary difference,
///    which have no decomposition: `ø`→`o`, `ł`→`l`, `đ` and `ð`→`d`, `ħ`→`h`, `ŧ`→`t`, and the
///    expansions `æ`→`ae`, `œ`→`oe`, `þ`→`th`;
/// 5. steps 1–3 once more, for what case mapping decomposed (`ǰ` upper-cases to `J` + caron).
///
/// Letters of other scripts that look alike (Cyrillic `а` for Latin `a`) are not folded: no
/// collation of these databases compares them equal, so they name other accounts upstream too.
public enum AccountSpelling {
    /// The folded form of `login`: equal for every spelling listed above.
    public static func folded(_ login: String) -> String {
        let once = stripped(lettersToBase(caseFolded(stripped(login.decomposedStringWithCompatibilityMapping))))
        return stripped(caseFolded(once.decomposedStringWithCompatibilityMapping).decomposedStringWithCompatibilityMapping)
    }

    /// Whether `scalar` is left out of the folded form: a mark, a default-ignorable code point, a
    /// format or a control character.
    public static func isIgnored(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .format, .control: return true
        default: return scalar.properties.isDefaultIgnorableCodePoint
        }
    }

    private static func stripped(_ text: String) -> String {
        var scalars = String.UnicodeScalarView()
        scalars.append(contentsOf: text.unicodeScalars.lazy.filter { !isIgnored($0) })
        return String(scalars)
    }

    private static func caseFolded(_ text: String) -> String { text.uppercased().lowercased() }

    /// Letters weighed as a base letter plus a secondary difference (DUCET), or as an expansion.
    private static let baseLetters: [Unicode.Scalar: String] = [
        "\u{00F8}": "o", "\u{0142}": "l", "\u{0111}": "d", "\u{00F0}": "d", "\u{0127}": "h", "\u{0167}": "t",
        "\u{00E6}": "ae", "\u{0153}": "oe", "\u{00FE}": "th", "\u{0131}": "i",
    ]

    private static func lettersToBase(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: { baseLetters[$0] != nil }) else { return text }
        var result = ""
        for scalar in text.unicodeScalars {
            if let base = baseLetters[scalar] { result += base } else { result.unicodeScalars.append(scalar) }
        }
        return result
    }
}
