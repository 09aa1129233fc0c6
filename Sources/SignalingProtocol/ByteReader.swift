/// Reads the field types of ByteWriter from a frame body, checking every length against
/// the bytes actually present, so a hostile length can never cause a large allocation or
/// an out-of-bounds read.
public struct ByteReader {
    @usableFromInline let base: UnsafeRawBufferPointer
    @usableFromInline var offset: Int
    /// The frame being read, for error messages (nil: `label` names what is read).
    @usableFromInline let context: FrameType?
    /// What is read when it is not a frame (a cluster relay packet), for error messages.
    @usableFromInline let label: StaticString

    public init(_ base: UnsafeRawBufferPointer, context: FrameType) {
        self.base = base
        self.offset = 0
        self.context = context
        self.label = ""
    }

    /// A reader of something other than a protocol frame, named `label` in its errors.
    public init(_ base: UnsafeRawBufferPointer, label: StaticString) {
        self.base = base
        self.offset = 0
        self.context = nil
        self.label = label
    }

    public var remaining: Int { base.count - offset }

    @usableFromInline func truncated(_ what: String) -> ProtocolViolation {
        if let context { return ProtocolViolation(.malformedFrame, "\(context) frame truncated in \(what)") }
        return ProtocolViolation(.malformedFrame, "\(label) truncated in \(what)")
    }

    @inlinable public mutating func u8(_ what: String) throws(ProtocolViolation) -> UInt8 {
        guard remaining >= 1 else { throw truncated(what) }
        defer { offset += 1 }
        return base[offset]
    }

    @inlinable public mutating func u16(_ what: String) throws(ProtocolViolation) -> UInt16 {
        guard remaining >= 2 else { throw truncated(what) }
        defer { offset += 2 }
        return UInt16(base[offset]) << 8 | UInt16(base[offset + 1])
    }

    @inlinable public mutating func u32(_ what: String) throws(ProtocolViolation) -> UInt32 {
        guard remaining >= 4 else { throw truncated(what) }
        var value: UInt32 = 0
        for index in offset..<(offset + 4) { value = value << 8 | UInt32(base[index]) }
        offset += 4
        return value
    }

    @inlinable public mutating func u64(_ what: String) throws(ProtocolViolation) -> UInt64 {
        let high = try u32(what)
        let low = try u32(what)
        return UInt64(high) << 32 | UInt64(low)
    }

    /// A `text` field of at most `maxBytes` UTF-8 bytes (and at least `minBytes`).
    public mutating func text(_ what: String, minBytes: Int = 0, maxBytes: Int) throws(ProtocolViolation) -> String {
        let count = Int(try u16(what))
        guard remaining >= count else { throw truncated(what) }
        guard count >= minBytes else {
            throw ProtocolViolation(.invalidField, "\(what) must not be empty")
        }
        guard count <= maxBytes else {
            throw ProtocolViolation(.invalidField, "\(what) is \(count) bytes, the limit is \(maxBytes)")
        }
        let slice = UnsafeRawBufferPointer(rebasing: base[offset..<(offset + count)])
        offset += count
        // ASCII is valid UTF-8, and the common case: taken as it is, it costs a third of
        // full validation (identifiers and content types are read for every request).
        if Self.isASCII(slice) { return String(decoding: slice, as: UTF8.self) }
        guard let string = String(validating: slice, as: UTF8.self) else {
            throw ProtocolViolation(.malformedFrame, "\(what) is not valid UTF-8")
        }
        return string
    }

    /// Whether every byte is below 0x80, eight at a time.
    static func isASCII(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        var high: UInt64 = 0
        while index + 8 <= bytes.count {
            high |= bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            index += 8
        }
        while index < bytes.count {
            high |= UInt64(bytes[index])
            index += 1
        }
        return high & 0x8080_8080_8080_8080 == 0
    }

    /// An identifier: 1...128 UTF-8 bytes with no control characters.
    public mutating func identifier(_ what: String) throws(ProtocolViolation) -> String {
        let start = offset + 2
        let value = try text(what, minBytes: 1, maxBytes: ProtocolLimits.maxIdentifierBytes)
        if Self.hasControlCharacter(UnsafeRawBufferPointer(rebasing: base[start..<offset])) {
            throw ProtocolViolation(.invalidField, "\(what) contains a control character")
        }
        return value
    }

    /// Whether any byte is a control character (below 0x20, or 0x7F), eight at a time as
    /// `isASCII` does: byte by byte, with a slice's bounds checks, this cost about 15
    /// instructions a byte, two identifiers a message (callgrind, issue 16).
    ///
    /// Per word: `(w - 0x20 in every byte) & ~w & 0x80 in every byte` is non-zero exactly
    /// when some byte is below 0x20 (a byte of 0x20 or more borrows nothing from the one
    /// above it, and `~w` leaves bytes of 0x80 and more out), and the same test for
    /// "below 1" on `w ^ 0x7F…` finds a byte of 0x7F. A tail shorter than a word is
    /// checked as the last eight bytes, overlapping the word before.
    static func hasControlCharacter(_ bytes: UnsafeRawBufferPointer) -> Bool {
        let count = bytes.count
        guard count >= 8 else {
            for byte in bytes where byte < 0x20 || byte == 0x7F { return true }
            return false
        }
        var index = 0
        while index + 8 <= count {
            if hasControlCharacter(word: bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)) { return true }
            index += 8
        }
        return index < count && hasControlCharacter(word: bytes.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self))
    }

    @inline(__always)
    private static func hasControlCharacter(word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highBits: UInt64 = 0x8080_8080_8080_8080
        let belowSpace = (word &- ones &* 0x20) & ~word & highBits
        let delete = word ^ (ones &* 0x7F)
        let isDelete = (delete &- ones) & ~delete & highBits
        return belowSpace | isDelete != 0
    }

    /// A `blob` field of at most `maxBytes` bytes.
    public mutating func blob(_ what: String, maxBytes: Int = Int.max) throws(ProtocolViolation) -> [UInt8] {
        let count = Int(try u32(what))
        guard remaining >= count else { throw truncated(what) }
        guard count <= maxBytes else {
            throw ProtocolViolation(.invalidField, "\(what) is \(count) bytes, the limit is \(maxBytes)")
        }
        defer { offset += count }
        return Array(UnsafeRawBufferPointer(rebasing: base[offset..<(offset + count)]))
    }

    public mutating func sessionID(_ what: String) throws(ProtocolViolation) -> SessionID {
        let high = try u64(what)
        let low = try u64(what)
        return SessionID(high: high, low: low)
    }

    public mutating func bytes(_ what: String, count: Int) throws(ProtocolViolation) -> [UInt8] {
        guard remaining >= count else { throw truncated(what) }
        defer { offset += count }
        return Array(UnsafeRawBufferPointer(rebasing: base[offset..<(offset + count)]))
    }
}
