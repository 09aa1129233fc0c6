import Testing
@testable import SignalingProtocol

/// A decoder told whose frames it reads refuses the other side's types from the type
/// byte alone: the close code never depends on whether the body happens to parse.
@Suite("Frame decoder checks the direction before the body")
struct FrameDirectionTests {
    private func violation(_ decoder: FrameDecoder, _ bytes: [UInt8]) -> ProtocolViolation? {
        do {
            _ = try bytes.withUnsafeBytes { try decoder.decode($0) }
            return nil
        } catch {
            return error as? ProtocolViolation
        }
    }

    private func frame(_ type: FrameType, _ body: [UInt8]) -> [UInt8] {
        var w = ByteWriter()
        w.u32(UInt32(body.count + 1))
        w.u8(type.rawValue)
        w.raw(body)
        return w.bytes
    }

    /// Bodies that do not parse as any frame (empty, one byte, a length running past the end)
    /// and one that does.
    private static let bodies: [[UInt8]] = [[], [0x01], [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]]

    @Test("every server-to-client type from a client is unknownFrameType, whatever its body",
          arguments: FrameType.allCases.filter { !$0.isSent(by: .client) })
    func serverTypeFromClient(type: FrameType) {
        let decoder = FrameDecoder(from: .client)
        for body in Self.bodies {
            #expect(violation(decoder, frame(type, body))?.code == .unknownFrameType, "\(type) body \(body)")
        }
        let wellFormed = SampleFrames.all.filter { $0.type == type }.map { FrameEncoder.encode($0) }
        for bytes in wellFormed {
            #expect(violation(decoder, bytes)?.code == .unknownFrameType, "well-formed \(type)")
        }
    }

    @Test("a malformed WELCOME is unknownFrameType from a client but malformedFrame to a decoder of both sides")
    func malformedWelcome() {
        let bytes = frame(.welcome, [0x00])
        #expect(violation(FrameDecoder(from: .client), bytes)?.code == .unknownFrameType)
        #expect(violation(FrameDecoder(from: .server), bytes)?.code == .malformedFrame)
        #expect(violation(FrameDecoder(), bytes)?.code == .malformedFrame)
    }

    @Test("a server-side decoder still decodes every client frame, and a client-side one every server frame")
    func ownDirectionDecodes() throws {
        for sample in SampleFrames.all {
            let bytes = FrameEncoder.encode(sample)
            for sender in [FrameSender.client, .server] where sample.type.isSent(by: sender) {
                let decoded = try bytes.withUnsafeBytes { try FrameDecoder(from: sender).decode($0) }
                #expect(decoded?.frame == sample, "\(sample.type) from \(sender)")
            }
        }
    }

    @Test("client-to-server types are refused by a decoder of server frames")
    func clientTypeFromServer() {
        let decoder = FrameDecoder(from: .server)
        for type in FrameType.allCases where !type.isSent(by: .server) {
            #expect(violation(decoder, frame(type, []))?.code == .unknownFrameType, "\(type)")
        }
        #expect(FrameType.ping.isSent(by: .client) && FrameType.ping.isSent(by: .server))
        #expect(FrameType.pong.isSent(by: .client) && FrameType.pong.isSent(by: .server))
    }
}
