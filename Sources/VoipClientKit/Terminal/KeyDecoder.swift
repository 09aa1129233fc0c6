/// A key the line editor understands.
public enum Key: Sendable, Equatable {
    /// A printable character (UTF-8 decoded).
    case character(Character)
    case enter
    case backspace
    case delete
    case left, right, up, down
    case home, end
    case wordLeft, wordRight
    case deleteWordBackward
    case deleteWordForward
    case killToEnd
    case killToStart
    case yank
    case transpose
    case clearScreen
    case tab
    /// Ctrl-D.
    case endOfInput
    /// Ctrl-C.
    case interrupt
}

/// Turns the bytes a terminal sends in raw mode into keys: UTF-8 characters, control
/// keys (Emacs-style, as in bash), and the escape sequences of arrows, Home/End,
/// Delete, Ctrl/Alt-arrows (xterm, VT100 and rxvt variants). A sequence or a character
/// split across reads is completed by the next read. Unknown sequences are dropped
/// whole, so they never turn into stray text.
public struct KeyDecoder: Sendable {
    private var pending: [UInt8] = []
    /// An incomplete escape sequence longer than this is garbage: drop it.
    private static let longestSequence = 32

    public init() {}

    public mutating func feed<Bytes: Sequence>(_ bytes: Bytes) -> [Key] where Bytes.Element == UInt8 {
        pending.append(contentsOf: bytes)
        var keys: [Key] = []
        var index = 0
        while index < pending.count {
            guard let (key, length) = decode(at: index) else { break }  // incomplete: wait for more
            if let key { keys.append(key) }
            index += length
        }
        pending.removeFirst(index)
        return keys
    }

    /// The key at `index` (nil key: consumed but meaningless) and how many bytes it took;
    /// nil when more bytes are needed.
    private func decode(at index: Int) -> (Key?, Int)? {
        let byte = pending[index]
        switch byte {
        case 0x1B: return escape(at: index)
        case 0x01: return (.home, 1)
        case 0x02: return (.left, 1)
        case 0x03: return (.interrupt, 1)
        case 0x04: return (.endOfInput, 1)
        case 0x05: return (.end, 1)
        case 0x06: return (.right, 1)
        case 0x08, 0x7F: return (.backspace, 1)
        case 0x09: return (.tab, 1)
        case 0x0D:
            // CR LF (pasted Windows text) is one Enter; CR alone must not wait for more.
            return (.enter, index + 1 < pending.count && pending[index + 1] == 0x0A ? 2 : 1)
        case 0x0A: return (.enter, 1)
        case 0x0B: return (.killToEnd, 1)
        case 0x0C: return (.clearScreen, 1)
        case 0x0E: return (.down, 1)
        case 0x10: return (.up, 1)
        case 0x14: return (.transpose, 1)
        case 0x15: return (.killToStart, 1)
        case 0x17: return (.deleteWordBackward, 1)
        case 0x19: return (.yank, 1)
        case 0x00..<0x20: return (nil, 1)
        case 0x20..<0x80: return (.character(Character(Unicode.Scalar(byte))), 1)
        default: return utf8(at: index)
        }
    }

    private func utf8(at index: Int) -> (Key?, Int)? {
        let lead = pending[index]
        let length: Int
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0...0xEF: length = 3
        case 0xF0...0xF4: length = 4
        default: return (.character("\u{FFFD}"), 1)
        }
        guard pending.count - index >= length else {
            // Incomplete so far; but a non-continuation byte already proves it broken.
            for offset in 1..<(pending.count - index) where pending[index + offset] & 0xC0 != 0x80 {
                return (.character("\u{FFFD}"), 1)
            }
            return nil
        }
        let bytes = pending[index..<index + length]
        guard let text = String(validating: bytes, as: UTF8.self), let character = text.first else {
            return (.character("\u{FFFD}"), 1)
        }
        return (.character(character), length)
    }

    private func escape(at index: Int) -> (Key?, Int)? {
        guard index + 1 < pending.count else { return nil }
        let next = pending[index + 1]
        switch next {
        case UInt8(ascii: "["): return controlSequence(at: index)
        case UInt8(ascii: "O"):
            guard index + 2 < pending.count else { return nil }
            return (cursorKey(pending[index + 2], modifiers: 1), 3)
        case 0x1B: return (nil, 1)  // ESC ESC: the first one means nothing
        case UInt8(ascii: "b"): return (.wordLeft, 2)
        case UInt8(ascii: "f"): return (.wordRight, 2)
        case UInt8(ascii: "d"): return (.deleteWordForward, 2)
        case 0x7F, 0x08: return (.deleteWordBackward, 2)
        default: return (nil, 2)  // Alt + a key we do not bind
        }
    }

    /// ESC [ parameters final: arrows (with Ctrl/Alt modifiers), Home/End, Delete.
    private func controlSequence(at index: Int) -> (Key?, Int)? {
        var end = index + 2
        while end < pending.count, !(0x40...0x7E).contains(pending[end]) { end += 1 }
        guard end < pending.count else {
            return pending.count - index > Self.longestSequence ? (nil, pending.count - index) : nil
        }
        let parameters = String(decoding: pending[(index + 2)..<end], as: UTF8.self)
            .split(separator: ";").map { Int($0) ?? 0 }
        let length = end - index + 1
        let final = pending[end]
        if final == UInt8(ascii: "~") {
            switch parameters.first ?? 0 {
            case 1, 7: return (.home, length)
            case 4, 8: return (.end, length)
            case 3: return (.delete, length)
            default: return (nil, length)  // PageUp/Down, F-keys, bracketed-paste markers
            }
        }
        let modifiers = parameters.count >= 2 ? parameters[1] : 1
        return (cursorKey(final, modifiers: modifiers), length)
    }

    /// A, B, C, D, H, F with an xterm modifier parameter (3 Alt, 5 Ctrl: move by word).
    private func cursorKey(_ final: UInt8, modifiers: Int) -> Key? {
        let byWord = modifiers == 3 || modifiers == 5
        switch final {
        case UInt8(ascii: "A"): return .up
        case UInt8(ascii: "B"): return .down
        case UInt8(ascii: "C"): return byWord ? .wordRight : .right
        case UInt8(ascii: "D"): return byWord ? .wordLeft : .left
        case UInt8(ascii: "H"): return .home
        case UInt8(ascii: "F"): return .end
        default: return nil
        }
    }
}
