/// Appends big-endian integers and length-prefixed fields to a byte array.
///
/// Field encodings (docs/PROTOCOL.md, "Field types"): `u8/u16/u32/u64` big-endian,
/// `text` = u16 length + UTF-8, `blob` = u32 length + bytes, `sid` = 16 raw bytes.
public struct ByteWriter {
    public var bytes: [UInt8]

    public init(capacity: Int = 64) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    public init(appendingTo bytes: [UInt8]) {
        self.bytes = bytes
    }

    @inlinable public mutating func u8(_ value: UInt8) { bytes.append(value) }

    @inlinable public mutating func u16(_ value: UInt16) {
        bytes.append(UInt8(truncatingIfNeeded: value >> 8))
        bytes.append(UInt8(truncatingIfNeeded: value))
    }

    @inlinable public mutating func u32(_ value: UInt32) {
        bytes.append(UInt8(truncatingIfNeeded: value >> 24))
        bytes.append(UInt8(truncatingIfNeeded: value >> 16))
        bytes.append(UInt8(truncatingIfNeeded: value >> 8))
        bytes.append(UInt8(truncatingIfNeeded: value))
    }

    @inlinable public mutating func u64(_ value: UInt64) {
        u32(UInt32(truncatingIfNeeded: value >> 32))
        u32(UInt32(truncatingIfNeeded: value))
    }

    /// A `text` field. Text longer than 65,535 UTF-8 bytes is cut at a character
    /// boundary; callers validate real limits before encoding.
    public mutating func text(_ value: String) {
        let utf8 = value.utf8
        let length = Self.encodedTextLength(utf8)
        u16(UInt16(length))
        if length == utf8.count {
            // The common case copies straight from the string's storage: no array of its
            // own per field.
            bytes.append(contentsOf: utf8)
        } else {
            bytes.append(contentsOf: utf8.prefix(length))
        }
    }

    /// How many of these UTF-8 bytes a `text` field holds: all of them, or, past 65,535,
    /// as many as end on a character boundary.
    static func encodedTextLength<Bytes: Collection<UInt8>>(_ utf8: Bytes) -> Int {
        let count = utf8.count
        guard count > Int(UInt16.max) else { return count }
        var cut = Int(UInt16.max)
        var boundary = utf8.index(utf8.startIndex, offsetBy: cut)
        // A continuation byte (10xxxxxx) at the cut belongs to the character before it.
        while cut > 0 && (utf8[boundary] & 0xC0) == 0x80 {
            cut -= 1
            boundary = utf8.index(utf8.startIndex, offsetBy: cut)
        }
        return cut
    }

    public mutating func blob(_ value: [UInt8]) {
        u32(UInt32(value.count))
        bytes.append(contentsOf: value)
    }

    public mutating func sessionID(_ value: SessionID) {
        u64(value.high)
        u64(value.low)
    }

    public mutating func raw(_ value: [UInt8]) { bytes.append(contentsOf: value) }
}
