import Testing
@testable import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

@Suite("System calls and sockets")
struct SocketCallsTests {
    @Test("an interrupted call is made again; a failure throws the call's name and errno")
    func runRetriesInterruptions() throws {
        var calls = 0
        let result = try SystemCall.run("fake") { () -> Int32 in
            calls += 1
            if calls == 1 {
                errno = EINTR
                return -1
            }
            return 7
        }
        #expect(result == 7 && calls == 2)
        let error = #expect(throws: SystemError.self) {
            try SystemCall.run("fake") { () -> Int32 in
                errno = EBADF
                return -1
            }
        }
        #expect(error?.call == "fake" && error?.code == EBADF)
    }

    @Test("I/O results: a count, would-block for EAGAIN, the errno otherwise, and EINTR retried")
    func ioResults() {
        #expect(SystemCall.io { 12 } == .transferred(12))
        #expect(SystemCall.io { errno = EAGAIN; return -1 } == .wouldBlock)
        #expect(SystemCall.io { errno = ECONNRESET; return -1 } == .failed(errno: ECONNRESET))
        var calls = 0
        #expect(SystemCall.io { calls += 1; if calls == 1 { errno = EINTR; return -1 }; return 3 } == .transferred(3))
    }

    /// Both ends of a loopback connection, non-blocking, made with a non-blocking connect.
    private func connectedPair() throws -> (client: Int32, server: Int32) {
        let listener = try SocketCalls.listenTCP(SocketCalls.socketAddress(0x7F00_0001, port: 0))
        defer { close(listener) }
        let port = try #require(SocketCalls.localPort(listener))
        let client = try SocketCalls.openTCP(nonBlocking: true)
        if try !SocketCalls.connect(client, SocketCalls.socketAddress(0x7F00_0001, port: port)) {
            #expect(SocketCalls.wait(client, for: Int16(POLLOUT), milliseconds: 5_000))
        }
        #expect(SocketCalls.pendingError(client) == 0)
        let server = try #require(try SocketCalls.accept(listener, nonBlocking: true))
        return (client, server)
    }

    @Test("a loopback connection: non-blocking connect, accept, send, peek, discard, receive, end of stream")
    func loopbackRoundTrip() throws {
        let (client, server) = try connectedPair()
        defer { close(client); close(server) }

        var buffer = [UInt8](repeating: 0, count: 16)
        #expect(buffer.withUnsafeMutableBytes { SocketCalls.receive(server, into: $0) } == .wouldBlock)
        let message: [UInt8] = [1, 2, 3, 4, 5]
        #expect(message.withUnsafeBytes { SocketCalls.send(client, $0) } == .transferred(5))
        #expect(SocketCalls.wait(server, for: Int16(POLLIN), milliseconds: 5_000))
        #expect(buffer.withUnsafeMutableBytes { SocketCalls.receive(server, into: $0, flags: Int32(MSG_PEEK)) } == .transferred(5))
        #expect(SocketCalls.discardPeeked(server, count: 2) == .transferred(2))
        #expect(buffer.withUnsafeMutableBytes { SocketCalls.receive(server, into: $0) } == .transferred(3))
        #expect(buffer[..<3] == [3, 4, 5])

        shutdown(client, Int32(SHUT_WR))
        #expect(SocketCalls.wait(server, for: Int16(POLLIN), milliseconds: 5_000))
        #expect(buffer.withUnsafeMutableBytes { SocketCalls.receive(server, into: $0) } == .transferred(0))
    }

    @Test("a send to a reset connection fails with its errno instead of raising SIGPIPE")
    func sendAfterResetFails() throws {
        let (client, server) = try connectedPair()
        defer { close(client) }
        try SocketCalls.setOption(server, level: SOL_SOCKET, name: SO_LINGER, linger(l_onoff: 1, l_linger: 0))
        close(server)  // RST
        #expect(SocketCalls.wait(client, for: Int16(POLLIN), milliseconds: 5_000))
        var failure: Int32?
        for _ in 0..<3 where failure == nil {
            if case .failed(let code) = [UInt8](repeating: 0, count: 64).withUnsafeBytes({ SocketCalls.send(client, $0) }) {
                failure = code
            }
        }
        #expect(failure == ECONNRESET || failure == EPIPE)
    }

    @Test("a refused non-blocking connect reports ECONNREFUSED through pendingError")
    func refusedConnect() throws {
        // A port nothing listens on: bind one, note it, close it.
        let probe = try SocketCalls.openTCP(nonBlocking: false)
        try SocketCalls.bind(probe, SocketCalls.socketAddress(0x7F00_0001, port: 0))
        let port = try #require(SocketCalls.localPort(probe))
        close(probe)
        let client = try SocketCalls.openTCP(nonBlocking: true)
        defer { close(client) }
        do {
            if try !SocketCalls.connect(client, SocketCalls.socketAddress(0x7F00_0001, port: port)) {
                #expect(SocketCalls.wait(client, for: Int16(POLLOUT), milliseconds: 5_000))
                #expect(SocketCalls.pendingError(client) == ECONNREFUSED)
            }
        } catch {
            #expect(error.code == ECONNREFUSED)
        }
    }

    @Test("options round-trip, and an impossible one names setsockopt")
    func options() throws {
        let fd = try SocketCalls.openTCP(nonBlocking: false)
        defer { close(fd) }
        try SocketCalls.setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, Int32(1))
        #expect(SocketCalls.integerOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY) != 0)
        #expect(SocketCalls.integerOption(fd, level: SOL_SOCKET, name: SO_TYPE) == Int32(SOCK_STREAM.rawValue))
        #expect(throws: SystemError.self) { try SocketCalls.setOption(-1, level: SOL_SOCKET, name: SO_KEEPALIVE, Int32(1)) }
    }
}
