import Testing
@testable import SignalingProtocol

@Suite("Frame codec")
struct FrameCodecTests {
    let decoder = FrameDecoder()

    private func decodeOne(_ bytes: [UInt8]) throws -> (frame: Frame, size: Int)? {
        try bytes.withUnsafeBytes { try decoder.decode($0) }
    }

    @Test("every frame type round-trips", arguments: SampleFrames.all)
    func roundTrip(frame: Frame) throws {
        let bytes = FrameEncoder.encode(frame)
        let decoded = try #require(try decodeOne(bytes))
        #expect(decoded.frame == frame)
        #expect(decoded.size == bytes.count)
        // The length prefix counts exactly the bytes after it.
        let length = Int(bytes[0]) << 24 | Int(bytes[1]) << 16 | Int(bytes[2]) << 8 | Int(bytes[3])
        #expect(length == bytes.count - 4)
        #expect(bytes[4] == frame.type.rawValue)
    }

    @Test("the samples cover every frame type")
    func samplesCoverEveryType() {
        let covered = Set(SampleFrames.all.map(\.type))
        #expect(covered == Set(FrameType.allCases))
    }

    @Test("text fields: UTF-8 with a u16 length, cut at a character boundary past 65,535 bytes")
    func textFields() throws {
        func encoded(_ value: String) -> [UInt8] {
            var writer = ByteWriter()
            writer.text(value)
            return writer.bytes
        }
        #expect(encoded("") == [0, 0])
        #expect(encoded("hé") == [0, 3, 0x68, 0xC3, 0xA9])
        // "é" spans bytes 65,534 and 65,535: the whole character goes, not half of it.
        let straddling = String(repeating: "a", count: 65_534) + "é" + "zzz"
        let cut = encoded(straddling)
        #expect(cut.count == 2 + 65_534 && cut[0] == 0xFF && cut[1] == 0xFE)
        #expect(cut[2...].allSatisfy { $0 == 0x61 })
        let ascii = encoded(String(repeating: "b", count: 70_000))
        #expect(ascii.count == 2 + 65_535 && ascii[0] == 0xFF && ascii[1] == 0xFF)
        // A bridged or foreign string takes the same path: a substring's copy.
        let substring = String(("x" + String(repeating: "y", count: 10)).dropFirst())
        #expect(encoded(substring) == [0, 10] + [UInt8](repeating: 0x79, count: 10))
    }

    @Test("event bodies, encoded in one exact-size allocation, cut text fields as ByteWriter does")
    func eventBodyText() {
        let straddling = String(repeating: "a", count: 65_534) + "é" + "zzz"
        let small = String(("x" + "yé").dropFirst())  // a substring's copy
        var reference = ByteWriter()
        reference.text(straddling)
        reference.text(small)
        let body = EncodedEvent(.callRang(callID: straddling, device: small)).body
        #expect(body.count == 2 + 65_534 + 2 + 3)
        #expect(body == reference.bytes)
        let empty = EncodedEvent(.callAccepted(callID: "", device: "", answer: [])).body
        #expect(empty == [0, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test("event bodies staged on the stack and bodies written in place encode alike, at the limit between them")
    func eventBodyAtTheStagingLimit() {
        let limit = EncodedEvent.stagedBodyLimit
        // callID "c" and device "d" take 3 bytes each, the answer's length 4: 10 + answer.
        for size in [10, limit - 1, limit, limit + 1, 4 * limit] {
            let answer = (0..<size - 10).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            var reference = ByteWriter()
            reference.text("c")
            reference.text("d")
            reference.blob(answer)
            let body = EncodedEvent(.callAccepted(callID: "c", device: "d", answer: answer)).body
            #expect(body.count == size)
            #expect(body == reference.bytes, "a body of \(size) bytes")
        }
    }

    @Test("an OK is 17 bytes: length 13, type, request id and server time big-endian; appended after what is there")
    func okFrameBytes() throws {
        var out: [UInt8] = [0xAA]
        FrameEncoder.append(.ok(requestID: 0x0102_0304, serverTime: 0x1112_1314_1516_1718), to: &out)
        #expect(out == [0xAA, 0, 0, 0, 13, FrameType.ok.rawValue, 1, 2, 3, 4,
                        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18])
        let decoded = try #require(try decodeOne(Array(out.dropFirst())))
        #expect(decoded.frame == .ok(requestID: 0x0102_0304, serverTime: 0x1112_1314_1516_1718))
    }

    @Test("a keep-alive costs five bytes on the wire")
    func pingIsTiny() {
        #expect(FrameEncoder.encode(.ping) == [0, 0, 0, 1, FrameType.ping.rawValue])
        #expect(FrameEncoder.encode(.pong) == [0, 0, 0, 1, FrameType.pong.rawValue])
    }

    @Test("a frame split at every byte offset decodes once it is complete", arguments: SampleFrames.all)
    func splitAtEveryOffset(frame: Frame) throws {
        let bytes = FrameEncoder.encode(frame)
        for cut in 0..<bytes.count {
            #expect(try decodeOne(Array(bytes[..<cut])) == nil, "prefix of \(cut) bytes must need more")
        }
        // A streaming reader fed one byte at a time sees the frame exactly once, at the end.
        var buffer: [UInt8] = []
        var decoded: [Frame] = []
        for byte in bytes {
            buffer.append(byte)
            let (frames, consumed) = try buffer.withUnsafeBytes { try decoder.decodeAll($0) }
            decoded += frames
            buffer.removeFirst(consumed)
        }
        #expect(decoded == [frame])
        #expect(buffer.isEmpty)
    }

    @Test("several frames in one read, cut anywhere, decode in order")
    func manyFramesInOneBuffer() throws {
        let stream = SampleFrames.all.flatMap { FrameEncoder.encode($0) }
        let (all, consumed) = try stream.withUnsafeBytes { try decoder.decodeAll($0) }
        #expect(all == SampleFrames.all)
        #expect(consumed == stream.count)

        for cut in stride(from: 1, to: stream.count, by: 7) {
            var pending = Array(stream[..<cut])
            var frames = try pending.withUnsafeBytes { try decoder.decodeAll($0) }
            pending.removeFirst(frames.consumed)
            pending += stream[cut...]
            let rest = try pending.withUnsafeBytes { try decoder.decodeAll($0) }
            #expect(frames.frames + rest.frames == SampleFrames.all)
            frames = rest
            #expect(rest.consumed == pending.count)
        }
    }

    @Test("a fanned-out event is encoded once and differs only in its sequence number")
    func encodedEventReuse() throws {
        let event = Event.callEnded(callID: "c", reason: .hungUp, peer: "p", serverTime: 1)
        let encoded = EncodedEvent(event)
        var out: [UInt8] = []
        FrameEncoder.append(event: encoded, seq: 7, to: &out)
        FrameEncoder.append(event: encoded, seq: 8, to: &out)
        #expect(out.count == 2 * encoded.frameSize)
        let (frames, _) = try out.withUnsafeBytes { try decoder.decodeAll($0) }
        #expect(frames == [.event(seq: 7, event), .event(seq: 8, event)])
    }
}
