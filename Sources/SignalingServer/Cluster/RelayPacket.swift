import SignalingProtocol

/// What a relaying node and the routing node say to each other about the devices the
/// relaying node holds the sockets of (docs/CLUSTER.md, "Every node serves devices"). One
/// packet goes over the `NodeLink` per send and carries one or more frames, so that a burst
/// costs one store command, not one per frame.
///
/// The relaying node (the *front*) owns the socket: TLS, the PROXY header, the per-address
/// cap and writing with back-pressure. The routing node (the *home*, the store lease's
/// holder) runs the protocol over the relayed bytes exactly as over a socket of its own:
/// handshake, keep-alive floor, idle timeout, takeover, routing. Both sides name a
/// connection by the front's id for it (`connection`, the front's packed `ConnectionRef`,
/// never reused while the front lives), together with the front's node id.
///
/// Order: the link keeps each sender's packets in order, and each side sends a
/// connection's frames in the order they happen, so the bytes of one connection arrive
/// whole and in order, or the link says it went down.
///
/// Wire format (all integers big-endian): `u8 version (1)`, `text from` (the sender's node
/// id), then frames until the end: `u8 kind`, `u64 connection`, and per kind:
/// - `open` (front → home): `text peer` (the client's address, after any PROXY header),
///   `u8 tls` (1: the device connected over TLS);
/// - `data` (both ways): `blob bytes` (front → home: what the device sent, as read;
///   home → front: whole protocol frames for the device);
/// - `closed` (front → home): nothing (the device's socket ended, or the front closed it);
/// - `finish` (home → front): nothing (everything is sent, the CLOSE last: write what is
///   queued, then end the stream and linger, as the home would with a socket of its own);
/// - `release` (home → front): nothing (the home forgot the connection: close the socket
///   now, unless `finish` is still writing);
/// - `reset` (front → home, connection 0): forget every connection of this front (sent at
///   the start of each link session and whenever the front's home changes).
public struct RelayPacket: Sendable, Equatable {
    public static let version: UInt8 = 1

    public enum Frame: Sendable, Equatable {
        case open(connection: UInt64, peer: String, tls: Bool)
        case data(connection: UInt64, bytes: [UInt8])
        case closed(connection: UInt64)
        case finish(connection: UInt64)
        case release(connection: UInt64)
        case reset

        var kind: UInt8 {
            switch self {
            case .open: 1
            case .data: 2
            case .closed: 3
            case .finish: 4
            case .release: 5
            case .reset: 6
            }
        }

        var connection: UInt64 {
            switch self {
            case .open(let connection, _, _), .data(let connection, _), .closed(let connection),
                .finish(let connection), .release(let connection):
                connection
            case .reset: 0
            }
        }
    }

    /// The sending node's id (its channel: where answers go).
    public var from: String
    public var frames: [Frame]

    public init(from: String, frames: [Frame]) {
        self.from = from
        self.frames = frames
    }

    public func encoded() -> [UInt8] {
        var writer = ByteWriter(capacity: 32 + frames.reduce(0) { $0 + 16 + Self.payloadSize($1) })
        writer.u8(Self.version)
        writer.text(from)
        for frame in frames {
            writer.u8(frame.kind)
            writer.u64(frame.connection)
            switch frame {
            case .open(_, let peer, let tls):
                writer.text(peer)
                writer.u8(tls ? 1 : 0)
            case .data(_, let bytes):
                writer.blob(bytes)
            case .closed, .finish, .release, .reset:
                break
            }
        }
        return writer.bytes
    }

    private static func payloadSize(_ frame: Frame) -> Int {
        switch frame {
        case .data(_, let bytes): bytes.count + 4
        case .open(_, let peer, _): peer.utf8.count + 3
        default: 0
        }
    }

    /// Decodes a packet. A packet from another version or cut short throws: the link
    /// carries only what nodes of this cluster sent, so a bad packet means a node of an
    /// incompatible version, and the receiver drops it (and logs it) rather than guess.
    public init(decoding packet: [UInt8]) throws(ProtocolViolation) {
        let decoded = packet.withUnsafeBytes { base in Result { () throws(ProtocolViolation) in try Self.decode(base) } }
        self = try decoded.get()
    }

    private static func decode(_ base: UnsafeRawBufferPointer) throws(ProtocolViolation) -> RelayPacket {
        var reader = ByteReader(base, label: "relay packet")
        let version = try reader.u8("version")
        guard version == Self.version else {
            throw ProtocolViolation(.malformedFrame, "relay packet version \(version), expected \(Self.version)")
        }
        let from = try reader.text("from", minBytes: 1, maxBytes: 1024)
        var frames: [Frame] = []
        while reader.remaining > 0 {
            let kind = try reader.u8("kind")
            let connection = try reader.u64("connection")
            switch kind {
            case 1:
                let peer = try reader.text("peer", maxBytes: 1024)
                frames.append(.open(connection: connection, peer: peer, tls: try reader.u8("tls") != 0))
            case 2: frames.append(.data(connection: connection, bytes: try reader.blob("bytes")))
            case 3: frames.append(.closed(connection: connection))
            case 4: frames.append(.finish(connection: connection))
            case 5: frames.append(.release(connection: connection))
            case 6: frames.append(.reset)
            default: throw ProtocolViolation(.malformedFrame, "relay frame of unknown kind \(kind)")
            }
        }
        return RelayPacket(from: from, frames: frames)
    }
}
