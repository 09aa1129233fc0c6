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
}
