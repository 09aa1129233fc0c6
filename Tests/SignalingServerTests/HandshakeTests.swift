import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingSupport
import Testing

@Suite("Handshake and bad input")
struct HandshakeTests {
    @Test("HELLO gets WELCOME with the 600 s keep-alive and a 900 s idle timeout")
    func welcome() throws {
        let server = try TestServer()
        let (_, welcome) = try server.connect(user: "alice")
        #expect(welcome.keepAliveSeconds == 600)
        #expect(welcome.idleTimeoutSeconds == 900)
        #expect(welcome.resumed == false)
        #expect(welcome.version == 1)
        #expect(welcome.maxFrameLength == 65536)
        #expect(welcome.ackedSeq == 0)
        #expect(welcome.serverTime == server.clock.wallMilliseconds())
    }

    @Test("PING gets PONG")
    func pingPong() throws {
        let server = try TestServer()
        let (client, _) = try server.connect(user: "alice")
        try client.send(.ping)
        #expect(try client.next() == .pong)
    }

    @Test("frames spanning many reads (peeked, handled, then taken) are each handled exactly once")
    func manyReads() throws {
        let server = try TestServer()
        let (client, _) = try server.connect(user: "alice")
        // 150 KB of 5-byte PINGs: more than two 64 KiB read buffers, with frames cut at
        // the buffer boundaries, so every callback peeks and takes several times.
        let pings = 30_000
        try client.sendRaw(Array(repeating: FrameEncoder.encode(.ping), count: pings).flatMap { $0 })
        try client.send(.request(id: 9, .pushRegister(platform: "apns", token: [1, 2, 3])))
        var pongs = 0
        var next = try client.next()
        while next == .pong {
            pongs += 1
            next = try client.next()
        }
        #expect(pongs == pings)
        // What ended the PONGs was the request's reply: no frame was handled twice.
        guard case .ok(9, _)? = next else { Issue.record("expected the OK of request 9, got \(String(describing: next))"); return }
        try client.send(.ping)
        #expect(try client.next() == .pong)
    }
}

@Suite("Bad input gets the documented error, and others are unharmed")
struct BadInputTests {
    /// Connects a bystander first, feeds `bytes` to a second connection, checks the CLOSE
    /// code, then checks the bystander still works and new clients are still served.
    private func expectRefusal(_ bytes: [UInt8], code: CloseCode, server: TestServer? = nil) throws {
        let server = try server ?? TestServer()
        let (bystander, _) = try server.connect(user: "bystander")
        let client = try server.client()
        try client.sendRaw(bytes)
        let close = try client.expectClose()
        #expect(close.code == code)
        #expect(close.action == code.defaultAction)
        #expect(!close.message.isEmpty)
        try bystander.send(.ping)
        #expect(try bystander.next() == .pong)
        _ = try server.connect(user: "newcomer")
    }

    private func hello(version: UInt16 = 1, magic: String = "VSIG", user: String = "u") -> [UInt8] {
        var w = ByteWriter()
        w.u32(0)
        w.u8(FrameType.hello.rawValue)
        w.raw(Array(magic.utf8)); w.u16(version); w.u8(0); w.u32(0); w.text(user); w.text("d")
        var bytes = w.bytes
        let length = UInt32(bytes.count - 4)
        bytes[0] = UInt8(length >> 24); bytes[1] = UInt8(length >> 16 & 0xff); bytes[2] = UInt8(length >> 8 & 0xff); bytes[3] = UInt8(length & 0xff)
        return bytes
    }

    @Test("version mismatch") func versionMismatch() throws {
        try expectRefusal(hello(version: 2), code: .unsupportedVersion)
    }

    @Test("wrong magic") func wrongMagic() throws {
        try expectRefusal(hello(magic: "SIGV"), code: .malformedFrame)
    }

    @Test("a frame before HELLO") func frameBeforeHello() throws {
        try expectRefusal(FrameEncoder.encode(.ping), code: .frameBeforeHello)
    }

    @Test("garbage bytes (an HTTP request)") func garbage() throws {
        try expectRefusal(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8), code: .frameTooLarge)
    }

    @Test("oversize length prefix") func oversize() throws {
        try expectRefusal([0x00, 0x01, 0x00, 0x01, FrameType.hello.rawValue], code: .frameTooLarge)
    }

    @Test("a truncated frame (fields shorter than the length says)") func truncated() throws {
        // A HELLO whose user id length claims more bytes than the frame holds.
        var w = ByteWriter()
        w.raw(Array("VSIG".utf8)); w.u16(1); w.u8(0); w.u32(0); w.u16(40); w.raw(Array("abc".utf8))
        var frame = ByteWriter()
        frame.u32(UInt32(w.bytes.count + 1)); frame.u8(FrameType.hello.rawValue); frame.raw(w.bytes)
        try expectRefusal(frame.bytes, code: .malformedFrame)
    }

    @Test("an unknown frame type") func unknownType() throws {
        try expectRefusal([0, 0, 0, 1, 0x7E], code: .unknownFrameType)
    }

    @Test("a server-only frame from a client") func serverOnlyFrame() throws {
        let server = try TestServer()
        let (client, welcome) = try server.connect(user: "alice")
        try client.send(.welcome(welcome))
        #expect(try client.expectClose().code == .unknownFrameType)
    }

    @Test("a server-only frame with a malformed body is unknownFrameType, before and after HELLO")
    func serverOnlyFrameMalformedBody() throws {
        // A WELCOME whose body is one byte: its type alone decides the code, not the body.
        let malformedWelcome: [UInt8] = [0, 0, 0, 2, FrameType.welcome.rawValue, 0x00]
        let server = try TestServer()
        let (client, _) = try server.connect(user: "alice")
        try client.sendRaw(malformedWelcome)
        #expect(try client.expectClose().code == .unknownFrameType)
        // An ERROR with no body at all, as the first frame.
        try expectRefusal([0, 0, 0, 1, FrameType.error.rawValue], code: .unknownFrameType)
    }

    @Test("a second HELLO") func duplicateHello() throws {
        let server = try TestServer()
        let (client, _) = try server.connect(user: "alice")
        try client.send(.hello(Hello(userID: "alice", deviceID: "d1")))
        #expect(try client.expectClose().code == .duplicateHello)
    }

    @Test("an invalid identifier") func invalidIdentifier() throws {
        try expectRefusal(hello(user: ""), code: .invalidField)
    }

    @Test("a frame split into single bytes is reassembled")
    func byteByByte() throws {
        let server = try TestServer()
        let client = try server.client()
        for byte in FrameEncoder.encode(.hello(Hello(userID: "slow", deviceID: "d"))) {
            try client.sendRaw([byte])
        }
        guard case .welcome? = try client.next() else { Issue.record("no WELCOME"); return }
        // Several frames in one write are all handled, in order.
        try client.sendRaw(FrameEncoder.encode(.ping) + FrameEncoder.encode(.ping) + FrameEncoder.encode(.ping))
        #expect(try client.next() == .pong)
        #expect(try client.next() == .pong)
        #expect(try client.next() == .pong)
    }

}

@Suite("Keep-alive negotiation and authentication")
struct KeepAliveNegotiationTests {

    @Test("the product refuses a configured interval under 600 s")
    func configurationFloor() {
        #expect(throws: KeepAlivePolicy.ConfigurationError.belowMinimum(599)) {
            try KeepAlivePolicy(defaultInterval: 599)
        }
        #expect(throws: UsageError.self) {
            try ServerOptions.configuration(from: ["--keepalive", "300"])
        }
    }

    @Test("with a secret, HELLO needs the user's token")
    func authentication() throws {
        let server = try TestServer { $0.authSecret = "s3cret" }
        let missing = try server.client()
        try missing.send(.hello(Hello(userID: "alice", deviceID: "d")))
        #expect(try missing.expectClose().code == .unauthorized)

        let wrong = try server.client()
        try wrong.send(.hello(Hello(userID: "alice", deviceID: "d", credentials: LegacyToken.make(secret: "s3cret", userID: "bob"))))
        #expect(try wrong.expectClose().code == .unauthorized)

        let right = try server.client()
        let welcome = try right.hello(user: "alice", credentials: LegacyToken.make(secret: "s3cret", userID: "alice"))
        #expect(welcome.keepAliveSeconds == 600)
    }
}
