import SignalingProtocol
import SignalingStore

/// Conversions between the records' Swift types and SQLite's column values.
enum StoredValue {
    /// Sequence numbers and ordinals are compared in SQL (acknowledge deletes `seq <= n`),
    /// so they must keep their order as signed integers: at most 2^63 - 1. A server
    /// counting one per event never gets there; a larger value is a bug and is refused.
    static func sequence(_ value: UInt64, _ what: String) throws(StoreError) -> Int64 {
        guard let stored = Int64(exactly: value) else {
            throw StoreError(.other, "\(what) \(value) is beyond the store's range (at most \(Int64.max))")
        }
        return stored
    }

    static func sequence(from stored: Int64) -> UInt64 { UInt64(bitPattern: stored) }

    /// Timestamps are only stored and read back, never compared in SQL: the bit pattern
    /// round-trips every value, "never" (UInt64.max) included.
    static func timestamp(_ value: UInt64) -> Int64 { Int64(bitPattern: value) }

    static func timestamp(from stored: Int64) -> UInt64 { UInt64(bitPattern: stored) }

    /// 16 bytes, big-endian high then low: byte order matches the hex form.
    static func bytes(of sessionID: SessionID) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        for word in [sessionID.high, sessionID.low] {
            for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        return bytes
    }

    static func sessionID(from bytes: [UInt8]) -> SessionID? {
        guard bytes.count == 16 else { return nil }
        func word(_ range: Range<Int>) -> UInt64 { bytes[range].reduce(0) { $0 << 8 | UInt64($1) } }
        return SessionID(high: word(0..<8), low: word(8..<16))
    }
}
