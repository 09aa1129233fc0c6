/// One UDP datagram of the call-path probe. All integers are big-endian:
///
///     magic "VCPR" | version u8 (1) | kind u8 | reserved u16 | token u64 | sequence u32 | sentAt u64 | zero padding
///
/// Datagrams are `wireSize` (172) bytes, the size of an RTP packet carrying 20 ms of
/// G.711 audio, so the probe sees what a voice stream would. The requester's `token`
/// (random per call) lets it recognise echoes of its own requests; `sentAt` is its
/// monotonic clock in nanoseconds, copied back in the echo, so the round trip needs no
/// table and no shared clock.
public struct ProbePacket: Sendable, Equatable {
    public enum Kind: UInt8, Sendable {
        /// "Please echo this."
        case request = 1
        /// The answer to a request: same token, sequence and timestamp.
        case echo = 2
        /// "My burst is over" (sent a few times), so the peer knows it may hang up.
        case done = 3
    }

    public static let magic: [UInt8] = Array("VCPR".utf8)
    public static let version: UInt8 = 1
    public static let headerSize = 28
    public static let wireSize = 172

    public var kind: Kind
    public var token: UInt64
    public var sequence: UInt32
    public var sentAt: UInt64

    public init(kind: Kind, token: UInt64, sequence: UInt32, sentAt: UInt64) {
        self.kind = kind
        self.token = token
        self.sequence = sequence
        self.sentAt = sentAt
    }

    /// The echo a responder sends back.
    public var echo: ProbePacket { ProbePacket(kind: .echo, token: token, sequence: sequence, sentAt: sentAt) }

    public var bytes: [UInt8] {
        var out = Self.magic
        out.reserveCapacity(Self.wireSize)
        out.append(Self.version)
        out.append(kind.rawValue)
        out.append(contentsOf: [0, 0])
        Self.append(token, bytes: 8, to: &out)
        Self.append(UInt64(sequence), bytes: 4, to: &out)
        Self.append(sentAt, bytes: 8, to: &out)
        out.append(contentsOf: repeatElement(0, count: Self.wireSize - out.count))
        return out
    }

    /// Nil for anything that is not a version-1 probe datagram (stray traffic is ignored).
    public init?<Bytes: RandomAccessCollection>(decoding bytes: Bytes) where Bytes.Element == UInt8, Bytes.Index == Int {
        guard bytes.count >= Self.headerSize else { return nil }
        let start = bytes.startIndex
        guard Array(bytes[start..<start + 4]) == Self.magic, bytes[start + 4] == Self.version,
              let kind = Kind(rawValue: bytes[start + 5])
        else { return nil }
        func read(_ offset: Int, _ count: Int) -> UInt64 {
            var value: UInt64 = 0
            for index in start + offset..<start + offset + count { value = value << 8 | UInt64(bytes[index]) }
            return value
        }
        self.kind = kind
        token = read(8, 8)
        sequence = UInt32(read(16, 4))
        sentAt = read(20, 8)
    }

    private static func append(_ value: UInt64, bytes count: Int, to out: inout [UInt8]) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }
}
