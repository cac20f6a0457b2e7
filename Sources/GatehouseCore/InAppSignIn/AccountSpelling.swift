import Foundation

/// The one form every spelling of an account is counted under.
///
/// An upstream may compare logins far more loosely than byte for byte: MySQL's default collation
/// (`utf8mb4_0900_ai_ci`), SQL Server's `CI_AI` collations and ICU's nondeterministic collations
/// ignore case, accents and default-ignorable code points. Any spelling such an upstream takes
/// for the account must meet the account's counters, or an attacker gets fresh limits by typing
/// `vïctim`, `vi\u{200B}ctim` or `vıctim`. The login is relayed as typed; only the counters' key
/// is folded, toward what these collations compare at the primary strength of the Unicode
/// Collation Algorithm (accent- and case-insensitive), and past it where that is simpler (every
/// spacing mark, every format character):
///
/// 1. compatibility decomposition (NFKD: full-width, ligatures, the Kelvin sign);
/// 2. combining marks (general categories Mn, Mc, Me) and default-ignorable code points (zero-width
///    space and joiners, soft hyphen, invisible operators, variation selectors, tags) removed, and
///    every other format character (Cf) and control character (Cc) with them;
/// 3. full case folding, written as upper then lower case: `ß` and `ẞ` become `ss`, `ı` and `İ`
///    become `i`, `ς` becomes `σ`, `ſ` becomes `s`;
/// 4. the letters the collation algorithm weighs as a base letter with a secondary difference,
///    which have no decomposition: `ø`→`o`, `ł`→`l`, `đ` and `ð`→`d`, `ħ`→`h`, `ŧ`→`t`, and the
///    expansions `æ`→`ae`, `œ`→`oe`, `þ`→`th`; `ŀ`→`l`, the combining small Latin letters and
///    the negative circled and squared letters as their letters;
/// 5. a decimal digit of any script as its ASCII digit, white space and the collation's ignored
///    extenders (tatweel) removed;
/// 6. steps 1–3 once more, for what case mapping decomposed (`ǰ` upper-cases to `J` + caron).
///
/// Letters of other scripts that look alike (Cyrillic `а` for Latin `a`) are not folded: no
/// collation of these databases compares them equal, so they name other accounts upstream too.
/// This is not the collation's whole primary key: rarer letters it weighs as a base letter
/// (insular and Volapük letters, `ꞡ`) still fold apart; the breaker and the per-address and
/// per-instance limits, which count every account, hold for them.
public enum AccountSpelling {
    /// The folded form of `login`: equal for every spelling listed above.
    public static func folded(_ login: String) -> String {
        let once = stripped(lettersToBase(caseFolded(stripped(lettersToBase(login).decomposedStringWithCompatibilityMapping))))
        return stripped(caseFolded(once.decomposedStringWithCompatibilityMapping).decomposedStringWithCompatibilityMapping)
    }

    /// Whether `scalar` is left out of the folded form: a mark, a default-ignorable code point, a
    /// format or a control character, white space (what a compatibility form decomposed into:
    /// a login typed with a space is refused before it is counted), and the extenders the
    /// collation ignores (Arabic tatweel, N'Ko lajanyalan).
    public static func isIgnored(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .format, .control: return true
        default: return scalar.properties.isDefaultIgnorableCodePoint || scalar.properties.isWhitespace || ignoredExtenders.contains(scalar.value)
        }
    }

    private static let ignoredExtenders: Set<UInt32> = [0x0640, 0x07FA]

    /// The scalars of `text` without the ignored ones, a decimal digit of any script as its ASCII
    /// digit (`١٩` and `१९` are `19` to the collation).
    private static func stripped(_ text: String) -> String {
        var scalars = String.UnicodeScalarView()
        for scalar in text.unicodeScalars where !isIgnored(scalar) {
            if scalar.properties.numericType == .decimal, let value = scalar.properties.numericValue, value >= 0, value <= 9,
               let digit = Unicode.Scalar(UInt32(0x30) + UInt32(value)) {
                scalars.append(digit)
            } else {
                scalars.append(scalar)
            }
        }
        return String(scalars)
    }

    private static func caseFolded(_ text: String) -> String { text.uppercased().lowercased() }

    /// Letters weighed as a base letter plus a secondary difference (DUCET), or as an expansion.
    private static let baseLetters: [Unicode.Scalar: String] = [
        "\u{00F8}": "o", "\u{0142}": "l", "\u{0111}": "d", "\u{00F0}": "d", "\u{0127}": "h", "\u{0167}": "t",
        "\u{00E6}": "ae", "\u{0153}": "oe", "\u{00FE}": "th", "\u{0131}": "i",
    ]

    /// The combining small Latin letters (U+0363–U+036F), which the collation weighs as their
    /// letters, not as accents.
    private static let combiningLetters: [Character] = Array("aeioucdhmrtvx")

    private static func base(of scalar: Unicode.Scalar) -> String? {
        if let base = baseLetters[scalar] { return base }
        switch scalar.value {
        case 0x0363...0x036F: return String(combiningLetters[Int(scalar.value - 0x0363)])
        case 0x013F, 0x0140: return "l"  // Ŀ ŀ: NFKD adds a middle dot the collation does not weigh
        case 0x1F150...0x1F169: return String(UnicodeScalar(UInt8(0x61 + scalar.value - 0x1F150)))  // negative circled A–Z
        case 0x1F170...0x1F189: return String(UnicodeScalar(UInt8(0x61 + scalar.value - 0x1F170)))  // negative squared A–Z
        default: return nil
        }
    }

    private static func lettersToBase(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: { base(of: $0) != nil }) else { return text }
        var result = ""
        for scalar in text.unicodeScalars {
            if let base = base(of: scalar) { result += base } else { result.unicodeScalars.append(scalar) }
        }
        return result
    }
}
