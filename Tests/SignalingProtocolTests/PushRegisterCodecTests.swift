import Testing
@testable import SignalingProtocol

@Suite("PUSH_REGISTER: kind, optional environment and topic")
struct PushRegisterCodecTests {
    let decoder = FrameDecoder(maxFrameLength: 8192)

    private func decode(_ bytes: [UInt8]) throws -> Frame? {
        try bytes.withUnsafeBytes { try decoder.decode($0)?.frame }
    }

    private func violation(_ bytes: [UInt8]) -> ProtocolViolation? {
        do {
            _ = try decode(bytes)
            return nil
        } catch {
            return error as? ProtocolViolation
        }
    }

    /// A PUSH_REGISTER frame (request id 5, platform "apns-voip", token [1, 2]) whose body
    /// continues with `tail`.
    private func register(tail: [UInt8]) -> [UInt8] {
        var body = ByteWriter()
        body.u32(5); body.text("apns-voip"); body.blob([1, 2]); body.raw(tail)
        var w = ByteWriter()
        w.u32(UInt32(body.bytes.count + 1))
        w.u8(FrameType.pushRegister.rawValue)
        w.raw(body.bytes)
        return w.bytes
    }

    private func text(_ value: String) -> [UInt8] {
        var w = ByteWriter()
        w.text(value)
        return w.bytes
    }

    @Test("without environment and topic the frame is byte for byte the earlier layout")
    func shortFormUnchanged() throws {
        let bytes = FrameEncoder.encode(.request(id: 5, .pushRegister(platform: "apns-voip", token: [1, 2])))
        #expect(bytes == register(tail: []))
        #expect(try decode(bytes) == .request(id: 5, .pushRegister(platform: "apns-voip", token: [1, 2])))
    }

    @Test("an environment alone, or an environment and a topic, follow the token and decode back")
    func longForms() throws {
        let environmentOnly = Frame.request(id: 5, .pushRegister(platform: "apns-voip", token: [1, 2], environment: "sandbox"))
        #expect(FrameEncoder.encode(environmentOnly) == register(tail: text("sandbox")))
        #expect(try decode(register(tail: text("sandbox"))) == environmentOnly)

        let both = Frame.request(id: 5, .pushRegister(
            platform: "apns-voip", token: [1, 2], environment: "production", topic: "com.example.app"))
        #expect(FrameEncoder.encode(both) == register(tail: text("production") + text("com.example.app")))
        #expect(try decode(register(tail: text("production") + text("com.example.app"))) == both)
    }

    @Test("a topic without an environment is written after an empty environment")
    func topicNeedsEnvironment() throws {
        let frame = Frame.request(id: 5, .pushRegister(platform: "apns-voip", token: [1, 2], topic: "com.example.app"))
        let bytes = FrameEncoder.encode(frame)
        #expect(bytes == register(tail: text("") + text("com.example.app")))
        #expect(try decode(bytes) == .request(id: 5, .pushRegister(
            platform: "apns-voip", token: [1, 2], environment: "", topic: "com.example.app")))
    }

    @Test("stray bytes after the token or a cut environment or topic are malformed, not ignored")
    func malformedTrailingBytes() {
        #expect(violation(register(tail: [0]))?.code == .malformedFrame)  // half a length
        #expect(violation(register(tail: [0, 5, 0x61]))?.code == .malformedFrame)  // environment cut short
        #expect(violation(register(tail: text("sandbox") + [0]))?.code == .malformedFrame)  // half a topic length
        #expect(violation(register(tail: text("sandbox") + [0, 9, 0x63, 0x6F]))?.code == .malformedFrame)  // topic cut short
        #expect(violation(register(tail: [0, 2, 0xC3, 0x28]))?.code == .malformedFrame)  // environment not UTF-8
        #expect(violation(register(tail: text("sandbox") + [0, 1, 0xFF]))?.code == .malformedFrame)  // topic not UTF-8
    }

    @Test("an environment over 32 bytes or a topic over 256 bytes is an invalid field")
    func oversizeFields() throws {
        #expect(violation(register(tail: text(String(repeating: "e", count: 33))))?.code == .invalidField)
        #expect(try decode(register(tail: text(String(repeating: "e", count: 32)))) != nil)
        let topic = String(repeating: "t", count: 257)
        #expect(violation(register(tail: text("sandbox") + text(topic)))?.code == .invalidField)
        #expect(try decode(register(tail: text("sandbox") + text(String(topic.dropLast())))) != nil)
    }

    @Test("bytes after the topic are ignored, as after the last field of any frame (PROTOCOL §2)")
    func bytesAfterTopicIgnored() throws {
        let decoded = try decode(register(tail: text("sandbox") + text("com.example.app") + [0xFF, 0, 1]))
        #expect(decoded == .request(id: 5, .pushRegister(
            platform: "apns-voip", token: [1, 2], environment: "sandbox", topic: "com.example.app")))
    }
}
