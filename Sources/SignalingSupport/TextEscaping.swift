/// The two escapings the project writes text with, in one place: the log's `key=value`
/// values and Prometheus label values and HELP texts share backslash escaping; JSON lines (logs,
/// voipclient's output) share RFC 8259 string literals.
public enum TextEscaping {
    /// `\`, `"` and newline escaped with a backslash (no surrounding quotes); with
    /// `quotes: false`, `"` is left alone (a Prometheus HELP text escapes only the other two).
    public static func backslashEscaped(_ value: String, quotes: Bool = true) -> String {
        // Most values need nothing: one pass over the bytes instead of building a copy
        // character by character (a `/metrics` scrape escapes hundreds of label values and
        // a hundred HELP texts).
        guard value.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\n") || (quotes && $0 == UInt8(ascii: "\"")) }) else {
            return value
        }
        var escaped = ""
        for character in value {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"" where quotes: escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    /// `text` as a JSON string literal, quotes included: RFC 8259 escapes, other control
    /// characters (and DEL) as \u00XX.
    public static func jsonString(_ text: String) -> String {
        var out = ""
        appendJSONString(text, to: &out)
        return out
    }

    /// Appends `text` as a JSON string literal to `out`.
    public static func appendJSONString(_ text: String, to out: inout String) {
        out += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}
