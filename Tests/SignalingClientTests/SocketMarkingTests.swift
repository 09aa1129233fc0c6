import Foundation
import Testing
import SignalingProtocol
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

@Suite("Marking the socket as VoIP")
struct SocketMarkingTests {
    private func connectedClient(host: String, keepAlive: UInt32 = 600) throws -> (TestClient, PeerConnection, SessionInfo) {
        let server = try ScriptedServer(host: host)
        let test = try TestClient(port: server.port, host: host)
        let serverSide = Thread.runAsync { try server.acceptSession(keepAlive: keepAlive) }
        let info = try test.client.connect(timeout: .seconds(5))
        let (peer, _) = try serverSide.value()
        return (test, peer, info)
    }

    @Test("IPv4: keep-alive, user timeout, no-delay and DSCP CS3 are read back with getsockopt")
    func ipv4Options() throws {
        let (test, peer, info) = try connectedClient(host: "127.0.0.1", keepAlive: 600)
        defer { test.client.shutdown(); peer.close() }
        #expect(info.markingFailures.isEmpty)
        let socket = try #require(test.socket)
        let tcp = Int32(IPPROTO_TCP)
        #expect(socket.integerOption(level: SOL_SOCKET, name: SO_KEEPALIVE) == 1)
        // Probes only after the server's idle timeout (1.5 × 600 s) of silence.
        #expect(socket.integerOption(level: tcp, name: TCP_KEEPIDLE) == 900)
        #expect(socket.integerOption(level: tcp, name: TCP_KEEPINTVL) == 10)
        #expect(socket.integerOption(level: tcp, name: TCP_KEEPCNT) == 3)
        #expect(socket.integerOption(level: tcp, name: Int32(TCP_USER_TIMEOUT)) == 30_000)
        #expect(socket.integerOption(level: tcp, name: TCP_NODELAY) != 0)
        #expect(socket.integerOption(level: Int32(IPPROTO_IP), name: IP_TOS) == 0x60)  // CS3 << 2
    }

    /// Some CI containers run without IPv6; the IPv4 test above still covers marking.
    static let ipv6LoopbackAvailable = (try? ScriptedServer(host: "::1")) != nil

    @Test("IPv6: the traffic class carries CS3", .enabled(if: ipv6LoopbackAvailable, "::1 is not configured here"))
    func ipv6TrafficClass() throws {
        let (test, peer, info) = try connectedClient(host: "::1", keepAlive: 1200)
        defer { test.client.shutdown(); peer.close() }
        #expect(info.localAddress.family == AF_INET6)
        let socket = try #require(test.socket)
        #expect(socket.integerOption(level: Int32(IPPROTO_IPV6), name: IPV6_TCLASS) == 0x60)
        #expect(socket.integerOption(level: Int32(IPPROTO_TCP), name: TCP_KEEPIDLE) == 1800)
    }

    @Test("configured values are applied as given")
    func customOptions() throws {
        var options = VoIPSocketOptions()
        options.keepAliveIdleSeconds = 1234
        options.keepAliveProbeCount = 5
        options.userTimeoutMilliseconds = 45_000
        options.dscp = 46  // EF
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port) { $0.socketOptions = options }
        defer { test.client.shutdown() }
        let serverSide = Thread.runAsync { try server.acceptSession() }
        try test.client.connect(timeout: .seconds(5))
        let (peer, _) = try serverSide.value()
        defer { peer.close() }
        let socket = try #require(test.socket)
        #expect(socket.integerOption(level: Int32(IPPROTO_TCP), name: TCP_KEEPIDLE) == 1234)
        #expect(socket.integerOption(level: Int32(IPPROTO_TCP), name: TCP_KEEPCNT) == 5)
        #expect(socket.integerOption(level: Int32(IPPROTO_TCP), name: Int32(TCP_USER_TIMEOUT)) == 45_000)
        #expect(socket.integerOption(level: Int32(IPPROTO_IP), name: IP_TOS) == 46 << 2)
    }
}
