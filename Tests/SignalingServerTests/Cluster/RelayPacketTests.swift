import SignalingProtocol
import Testing

@testable import SignalingServer

@Suite("Relay packets between nodes")
struct RelayPacketTests {
    @Test("every kind of frame survives encoding and decoding, in order")
    func roundTrip() throws {
        let packet = RelayPacket(
            from: "host/42/abc",
            frames: [
                .reset,
                .open(connection: 7, peer: "203.0.113.9", tls: true),
                .data(connection: 7, bytes: [1, 2, 3]),
                .data(connection: 8, bytes: []),
                .closed(connection: 8),
                .finish(connection: 7),
                .release(connection: UInt64.max),
            ])
        #expect(try RelayPacket(decoding: packet.encoded()) == packet)
    }

    @Test("a packet cut short, of another version or with an unknown kind is refused, never half-read")
    func badPacketsThrow() {
        let whole = RelayPacket(from: "n", frames: [.data(connection: 1, bytes: [9, 9, 9, 9])]).encoded()
        for cut in 1..<whole.count where cut != 4 {  // 4: the header alone is a valid empty packet
            #expect(throws: ProtocolViolation.self) { try RelayPacket(decoding: Array(whole[..<cut])) }
        }
        var otherVersion = whole
        otherVersion[0] = 2
        #expect(throws: ProtocolViolation.self) { try RelayPacket(decoding: otherVersion) }
        var unknownKind = whole
        unknownKind[4] = 99
        #expect(throws: ProtocolViolation.self) { try RelayPacket(decoding: unknownKind) }
    }
}
