import Testing
@testable import SignalingProtocol

@Suite("Frame decoder rejects bad input")
struct FrameDecoderErrorTests {
    let decoder = FrameDecoder(maxFrameLength: 1024)

    private func violation(_ bytes: [UInt8]) -> ProtocolViolation? {
        do {
            _ = try bytes.withUnsafeBytes { try decoder.decode($0) }
            return nil
        } catch {
            return error as? ProtocolViolation
        }
    }

    /// A frame with the given type and body, length prefix included.
    private func frame(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
        var w = ByteWriter()
        w.u32(UInt32(body.count + 1))
        w.u8(type)
        w.raw(body)
        return w.bytes
    }

    @Test("an oversize length prefix is refused from its first four bytes, before any body arrives")
    func oversizeLength() {
        #expect(violation([0, 0, 4, 1])?.code == .frameTooLarge)
        #expect(violation([0xFF, 0xFF, 0xFF, 0xFF])?.code == .frameTooLarge)
        // An HTTP request or TLS hello on the port is an absurd length, not a hang.
        #expect(violation(Array("GET / HTTP/1.1\r\n".utf8))?.code == .frameTooLarge)
    }

    @Test("a zero length is malformed")
    func zeroLength() {
        #expect(violation([0, 0, 0, 0])?.code == .malformedFrame)
    }

    @Test("an unknown type byte is refused")
    func unknownType() {
        #expect(violation(frame(0x7F, []))?.code == .unknownFrameType)
        #expect(violation(frame(0x00, []))?.code == .unknownFrameType)
    }

    @Test("a frame whose fields run past its length is malformed", arguments: SampleFrames.all)
    func truncatedFields(sample: Frame) {
        let full = FrameEncoder.encode(sample)
        let body = Array(full[5...])
        guard !body.isEmpty else { return }  // PING/PONG have no fields to truncate
        // Every shorter body, re-framed with a consistent length, must fail cleanly;
        // none may crash or read outside the buffer. A cut exactly before an optional
        // trailing field (PUSH_REGISTER's environment and topic) is the shorter frame.
        let shorter = Dictionary(uniqueKeysWithValues: SampleFrames.shorterForms(of: sample).map {
            (FrameEncoder.encode($0).count - 5, $0)
        })
        for cut in 0..<body.count {
            let bytes = frame(full[4], Array(body[..<cut]))
            if let form = shorter[cut] {
                #expect(bytes.withUnsafeBytes { try? decoder.decode($0) }?.frame == form, "cut at \(cut) of \(sample.type)")
                continue
            }
            let code = violation(bytes)?.code
            #expect(code == .malformedFrame || code == .invalidField, "cut at \(cut) of \(sample.type)")
        }
    }

    @Test("HELLO with a wrong magic, a wrong version, or bad identifiers")
    func badHello() {
        var good = ByteWriter()
        good.raw(Array("VSIG".utf8)); good.u16(1); good.u8(0); good.u32(0); good.text("u"); good.text("d")
        #expect(violation(frame(0x01, good.bytes)) == nil)

        var magic = ByteWriter()
        magic.raw(Array("HTTP".utf8)); magic.u16(1); magic.u8(0); magic.u32(0); magic.text("u"); magic.text("d")
        #expect(violation(frame(0x01, magic.bytes))?.code == .malformedFrame)

        var version = ByteWriter()
        version.raw(Array("VSIG".utf8)); version.u16(2)
        let versionError = violation(frame(0x01, version.bytes))
        #expect(versionError?.code == .unsupportedVersion)
        #expect(versionError?.message.contains("version 1") == true)

        var empty = ByteWriter()
        empty.raw(Array("VSIG".utf8)); empty.u16(1); empty.u8(0); empty.u32(0); empty.text(""); empty.text("d")
        #expect(violation(frame(0x01, empty.bytes))?.code == .invalidField)

        var long = ByteWriter()
        long.raw(Array("VSIG".utf8)); long.u16(1); long.u8(0); long.u32(0)
        long.text(String(repeating: "x", count: 129)); long.text("d")
        #expect(violation(frame(0x01, long.bytes))?.code == .invalidField)

        var control = ByteWriter()
        control.raw(Array("VSIG".utf8)); control.u16(1); control.u8(0); control.u32(0); control.text("a\u{0}b"); control.text("d")
        #expect(violation(frame(0x01, control.bytes))?.code == .invalidField)
    }

    @Test("an identifier's control characters are found word by word exactly as byte by byte: every byte value at every place, in identifiers of 1 to 24 bytes")
    func controlCharactersEveryPlace() {
        for length in 1...24 {
            for place in 0..<length {
                for value in 0...255 {
                    var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    bytes[place] = UInt8(value)
                    // Neighbours that a borrow could reach: a byte just above the range
                    // and one with the high bit set.
                    if place + 1 < length { bytes[place + 1] = 0x20 }
                    if place > 0 { bytes[place - 1] = 0x80 }
                    let expected = bytes.contains { $0 < 0x20 || $0 == 0x7F }
                    let found = bytes.withUnsafeBytes { ByteReader.hasControlCharacter($0) }
                    #expect(found == expected, "\(bytes)")
                }
            }
        }
        // A whole identifier through the decoder: DEL at the end of a word's tail.
        var delete = ByteWriter()
        delete.raw(Array("VSIG".utf8)); delete.u16(1); delete.u8(0); delete.u32(0)
        delete.text("abcdefghij\u{7F}"); delete.text("d")
        #expect(violation(frame(0x01, delete.bytes))?.code == .invalidField)
    }

    @Test("text that is not UTF-8 is malformed")
    func invalidUTF8() {
        var w = ByteWriter()
        w.raw(Array("VSIG".utf8)); w.u16(1); w.u8(0); w.u32(0)
        w.u16(2); w.raw([0xC3, 0x28]); w.text("d")
        #expect(violation(frame(0x01, w.bytes))?.code == .malformedFrame)
        // ASCII text skips full validation, eight bytes at a time: a bad byte inside a
        // word, in the tail after words, or alone after ASCII words is still caught.
        for bad: [UInt8] in [
            Array("abc".utf8) + [0xC3, 0x28] + Array("defgh".utf8),
            Array("abcdefgh".utf8) + [0xC3, 0x28],
            Array("abcdefghabcdefgh".utf8) + [0xFF],
        ] {
            var message = ByteWriter()
            message.text("m1"); message.text("bob"); message.u16(UInt16(bad.count)); message.raw(bad); message.blob([1])
            #expect(violation(frame(FrameType.messageSend.rawValue, [0, 0, 0, 7] + message.bytes))?.code == .malformedFrame)
        }
        let accented = "text/plain; é=ü, 日本"
        let request = Frame.request(id: 7, .messageSend(OutgoingMessage(
            messageID: "m1", recipient: "bob", contentType: accented, body: [1])))
        let decoded = FrameEncoder.encode(request).withUnsafeBytes { try? decoder.decode($0) }
        #expect(decoded?.frame == request)
    }

    @Test("a blob length larger than the frame is malformed, never an allocation")
    func hugeBlobLength() {
        var w = ByteWriter()
        w.u32(1); w.text("c1"); w.text("bob"); w.u32(0xFFFF_FFF0)
        #expect(violation(frame(FrameType.callInvite.rawValue, w.bytes))?.code == .malformedFrame)
    }

    @Test("a reject reason other than declined or busy is an invalid field")
    func badRejectReason() {
        var w = ByteWriter()
        w.u32(1); w.text("c1"); w.u8(CallEndReason.hungUp.rawValue)
        #expect(violation(frame(FrameType.callReject.rawValue, w.bytes))?.code == .invalidField)
    }

    @Test("random bytes never crash the decoder")
    func randomBytes() {
        var generator = SystemRandomNumberGenerator()
        let lenient = FrameDecoder(maxFrameLength: 256)
        for _ in 0..<20_000 {
            let count = Int.random(in: 0...64, using: &generator)
            var bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if count >= 5 {  // make plausible lengths and types common
                bytes[0] = 0; bytes[1] = 0; bytes[2] = 0; bytes[3] = UInt8(count - 4)
                bytes[4] = FrameType.allCases.randomElement(using: &generator)!.rawValue
            }
            _ = try? bytes.withUnsafeBytes { try lenient.decodeAll($0) }
        }
    }
}
