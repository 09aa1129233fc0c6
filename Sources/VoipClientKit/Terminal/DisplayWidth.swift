/// How many terminal columns text takes: 0 for combining marks and other zero-width
/// scalars, 2 for East Asian wide and fullwidth characters and emoji, 1 otherwise. An
/// approximation of wcwidth(3) that needs no locale, good enough to keep the cursor
/// where the user sees it.
public enum DisplayWidth {
    public static func of(_ character: Character) -> Int {
        var width = 0
        for scalar in character.unicodeScalars { width = max(width, of(scalar)) }
        return width
    }

    public static func of<Characters: Sequence>(_ text: Characters) -> Int where Characters.Element == Character {
        text.reduce(0) { $0 + of($1) }
    }

    static func of(_ scalar: Unicode.Scalar) -> Int {
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .enclosingMark, .format, .control: return 0
        default: break
        }
        if scalar.value == 0x200B { return 0 }
        return isWide(scalar.value) ? 2 : 1
    }

    private static func isWide(_ value: UInt32) -> Bool {
        switch value {
        case 0x1100...0x115F, 0x2E80...0x303E, 0x3041...0x33FF, 0x3400...0x4DBF, 0x4E00...0x9FFF,
             0xA000...0xA4CF, 0xAC00...0xD7A3, 0xF900...0xFAFF, 0xFE30...0xFE4F, 0xFF00...0xFF60,
             0xFFE0...0xFFE6, 0x1F300...0x1F64F, 0x1F900...0x1F9FF, 0x20000...0x2FFFD, 0x30000...0x3FFFD:
            return true
        default:
            return false
        }
    }
}
