import GatehouseCore
import Testing

/// Every spelling an upstream's collation could take for one account folds to one form
/// (MySQL's `utf8mb4_0900_ai_ci`, SQL Server's `CI_AI`, ICU nondeterministic collations compare
/// without case, accents and ignorable code points): one class of spelling per argument.
struct AccountSpellingTests {
    static let victim = "victim@example.com"

    @Test(arguments: [
        ("VICTIM@Example.COM", "case"),
        ("vïctim@example.com", "a diaeresis, precomposed"),
        ("vi\u{0308}ctim@example.com", "a diaeresis, combining"),
        ("víctim@example.com", "an acute accent"),
        ("vi\u{200B}ctim@example.com", "a zero-width space"),
        ("vic\u{00AD}tim@example.com", "a soft hyphen"),
        ("v\u{0131}ctim@example.com", "a dotless i"),
        ("V\u{0130}CTIM@example.com", "a dotted capital I"),
        ("victim\u{2063}@example.com", "an invisible separator"),
        ("victim@example.com\u{2063}", "an invisible separator at the end"),
        ("vi\u{200D}ct\u{2060}im@exa\u{FEFF}mple.com", "joiners, word joiner and byte-order mark"),
        ("victim\u{FE0F}@example.com", "a variation selector"),
        ("\u{FF56}\u{FF49}\u{FF43}\u{FF54}\u{FF49}\u{FF4D}@example.com", "full-width letters"),
        ("vi\u{034F}ctim@example.com", "a combining grapheme joiner"),
        ("victim\u{E0020}@example.com", "a tag character"),
        ("vi\u{0001}ctim@example.com", "a control character"),
        ("vic\u{0640}tim@example.com", "an Arabic tatweel"),
        ("vic\u{FE70}tim@example.com", "an Arabic presentation form (a space and a mark)"),
        ("v\u{1F158}ctim@example.com", "a negative circled letter"),
        ("v\u{1F178}ctim@example.com", "a negative squared letter"),
    ])
    func aSpellingFoldsToTheAccount(spelling: String, what: String) {
        #expect(AccountSpelling.folded(spelling) == AccountSpelling.folded(Self.victim), "\(what)")
        #expect(AccountSpelling.folded(spelling) == Self.victim, "\(what)")
    }

    @Test(arguments: [
        ("straße", "strasse"), ("STRAẞE", "strasse"), ("ſam", "sam"), ("ΟΔΥΣΣΕΥΣ", AccountSpelling.folded("ὀδυσσεύς")),
        ("søren", "soren"), ("łukasz", "lukasz"), ("đorđe", "dorde"), ("æsir", "aesir"), ("œuvre", "oeuvre"), ("þór", "thor"),
        ("ǰan", "jan"), ("ﬁona", "fiona"), ("alice\u{0661}\u{0669}\u{0669}\u{0660}", "alice1990"), ("alice१९९०", "alice1990"),
        ("a\u{0363}ron", "aaron"), ("ŀl", "ll"), ("\u{212A}elvin", "kelvin"),
    ])
    func lettersFoldAsTheCollationsCompareThem(spelling: String, folded: String) {
        #expect(AccountSpelling.folded(spelling) == folded)
    }

    @Test func otherAccountsStayApart() {
        #expect(AccountSpelling.folded("victim@example.com") != AccountSpelling.folded("victim2@example.com"))
        #expect(AccountSpelling.folded("v.ictim@example.com") != AccountSpelling.folded("victim@example.com"))
        // Another script's look-alike names another account in every collation these databases use.
        #expect(AccountSpelling.folded("vi\u{0441}tim@example.com") != AccountSpelling.folded("victim@example.com"))
    }

    @Test func foldingIsStable() {
        for spelling in ["vïctim", "STRAẞE", "ǰan", "vi\u{200B}ctim", "ΟΔΥΣΣΕΥΣ"] {
            let once = AccountSpelling.folded(spelling)
            #expect(AccountSpelling.folded(once) == once)
        }
    }
}
