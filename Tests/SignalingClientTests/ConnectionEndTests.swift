import Foundation
import SignalingProtocol
import SignalingSupport
import Synchronization
import Testing
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

/// How a connection's I/O thread ends when the server closes it.
@Suite("Connection ends")
struct ConnectionEndTests {
    @Test("a CLOSE that arrived before the server reset the connection reaches the core even when a write is the first to find it gone")
    func closeReadBeforeAFailedWrite() throws {
        // The server's side: CLOSE goingAway, then a reset (a server that closes with the
        // client's bytes unread resets the connection). Both reach the client's socket
        // before its I/O thread starts, which then has a PING to write first: the write
        // fails, and the CLOSE still waits in the receive buffer.
        let listener = try SocketCalls.listenTCP(SocketCalls.socketAddress(0x7F00_0001, port: 0), backlog: 1)
        defer { close(listener) }
        let port = try #require(SocketCalls.localPort(listener))
        let clientFD = try SocketCalls.openTCP(nonBlocking: false)
        _ = try SocketCalls.connect(clientFD, SocketCalls.socketAddress(0x7F00_0001, port: port))
        let serverFD = try #require(try SocketCalls.accept(listener))
        let closeFrame = Close(code: .goingAway, retryAfterMs: 300, message: "restarting")
        let bytes = FrameEncoder.encode(.close(closeFrame))
        #expect(bytes.withUnsafeBytes { Glibc.send(serverFD, $0.baseAddress, $0.count, 0) } == bytes.count)
        try SocketCalls.setOption(serverFD, level: SOL_SOCKET, name: SO_LINGER, linger(l_onoff: 1, l_linger: 0))
        close(serverFD)
        // The reset has arrived once the socket reports it (loopback: at once).
        var fds = [pollfd(fd: clientFD, events: Int16(POLLIN), revents: 0)]
        #expect(poll(&fds, 1, 5_000) == 1)
        try SocketCalls.setNonBlocking(clientFD)

        let address = try #require(SocketAddress(family: AF_INET, addressBytes: [127, 0, 0, 1], port: port))
        let welcome = Welcome(
            sessionID: SessionID(high: 1, low: 2), resumed: false, keepAliveSeconds: 600, idleTimeoutSeconds: 900,
            serverTime: 0, maxFrameLength: 65_536, ackedSeq: 0)
        let connection = try Connection(id: 1, handshaken: HandshakenSocket(
            stream: SocketStream(plain: SocketHandle(descriptor: clientFD)), welcome: welcome, server: 0,
            localAddress: address, remoteAddress: address, leftover: [], resumeRefused: false, credentials: nil, tlsSession: nil))
        connection.send(FrameEncoder.encode(.ping))
        let inputs = Mutex<[ConnectionInput]>([])
        connection.start(leftover: []) { input in inputs.withLock { $0.append(input) } }
        #expect(connection.waitUntilEnded(timeout: .seconds(5)))
        let deadline = ContinuousClock.now + .seconds(5)
        while inputs.withLock({ $0.count }) < 2 && ContinuousClock.now < deadline { usleep(1_000) }
        let seen = inputs.withLock { $0 }
        guard seen.count == 2, case .frames(let frames) = seen[0], case .ended = seen[1] else {
            Issue.record("expected the CLOSE, then the end; got \(seen)")
            return
        }
        #expect(frames == [.close(closeFrame)])
    }
}
