import CLinuxShims
import Foundation
import SignalingProtocol
import SignalingSupport
import SignalingTLS
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

/// A test failure with a message (thrown by the fixtures instead of crashing).
struct FixtureError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A real TCP listener on an ephemeral loopback port whose server side the test scripts
/// frame by frame: accept, read HELLO, answer WELCOME or CLOSE, send events, drop the
/// connection. Every wait has a deadline. With a TLS context, each accepted connection
/// does the server side of a real TLS handshake (OpenSSL) before any frame.
final class ScriptedServer: @unchecked Sendable {
    let descriptor: Int32
    let port: UInt16
    let host: String
    let tls: TLSServerContext?

    init(host: String = "127.0.0.1", tls: TLSServerContext? = nil) throws {
        self.host = host
        self.tls = tls
        let family = host.contains(":") ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw FixtureError("socket: \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let address = try SocketAddress.resolve(host: host, port: 0)[0].withPort(0)
        let status = address.withSockaddr { bind(fd, $0, $1) }
        guard status == 0, listen(fd, 16) == 0 else {
            close(fd)
            throw FixtureError("bind/listen \(host): \(errno)")
        }
        descriptor = fd
        port = SocketHandle(descriptor: dup(fd)).localAddress()!.port
    }

    deinit { close(descriptor) }

    /// Accepts the next connection.
    func accept(within timeout: Duration = .seconds(5)) throws -> PeerConnection {
        guard waitReadable(descriptor, timeout) else { throw FixtureError("no connection within \(timeout)") }
        // Close-on-exec: tests on other threads spawn processes, which must not hold it.
        let fd = shim_accept_cloexec(descriptor)
        guard fd >= 0 else { throw FixtureError("accept: \(errno)") }
        guard let tls else { return PeerConnection(descriptor: fd) }
        return try PeerConnection(descriptor: fd, handshakingWith: tls, within: timeout)
    }

    /// Accepts, reads HELLO and answers WELCOME: a connection ready for events.
    func acceptSession(sessionID: SessionID = SessionID(high: 1, low: 1), keepAlive: UInt32 = 600, ackedSeq: UInt64 = 0,
                       resumed: Bool = false, within timeout: Duration = .seconds(5)) throws -> (PeerConnection, Hello) {
        let peer = try accept(within: timeout)
        let hello = try peer.expectHello(within: timeout)
        try peer.sendWelcome(sessionID: sessionID, keepAlive: keepAlive, ackedSeq: ackedSeq, resumed: resumed)
        return (peer, hello)
    }
}

/// The server side of one accepted connection.
final class PeerConnection: @unchecked Sendable {
    let descriptor: Int32
    /// The server side of TLS, handshaken; nil for plain TCP.
    let tls: TLSConnection?
    private var assembler = FrameAssembler(maxFrameLength: 1 << 20)
    private var isClosed = false

    init(descriptor: Int32) {
        self.descriptor = descriptor
        self.tls = nil
    }

    /// Accepts TLS on a blocking socket whose reads and writes time out after `timeout`
    /// (so a stuck handshake fails instead of hanging); throws what OpenSSL reported.
    init(descriptor: Int32, handshakingWith context: TLSServerContext, within timeout: Duration) throws {
        self.descriptor = descriptor
        // OpenSSL writes with write(2): a client that already closed must fail the write,
        // not kill the test process.
        signal(SIGPIPE, SIG_IGN)
        var limit = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: Int(timeout.components.attoseconds / 1_000_000_000_000))
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        guard let tls = TLSConnection.accepting(fd: descriptor, context: context) else {
            Glibc.close(descriptor)
            throw FixtureError("cannot start TLS")
        }
        self.tls = tls
        let status = tls.handshake()
        guard status == .done(0) else {
            close()
            throw FixtureError("TLS handshake: \(status)")
        }
    }

    deinit { close() }

    func close() {
        guard !isClosed else { return }
        isClosed = true
        tls?.free()
        Glibc.close(descriptor)
    }

    /// Bytes read from the client (decrypted with TLS); 0 at its close, -1 on an error.
    private func receive(into chunk: inout [UInt8]) -> Int {
        guard let tls else { return chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) } }
        switch chunk.withUnsafeMutableBytes({ tls.read(into: $0) }) {
        case .done(let count): return count
        case .closed: return 0
        default: return -1
        }
    }

    /// True when bytes can be read now: TLS may already hold some (a server reads ahead).
    private func readable(within timeout: Duration) -> Bool {
        tls?.hasBufferedInput == true || waitReadable(descriptor, timeout)
    }

    /// Resets the connection (RST), like a crashed server or a dropped NAT mapping.
    func reset() {
        var option = linger(l_onoff: 1, l_linger: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
        close()
    }

    func send(_ frame: Frame) throws { try sendRaw(FrameEncoder.encode(frame)) }

    func sendRaw(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let count: Int
            if let tls {
                let status = bytes.withUnsafeBytes { tls.write(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
                guard case .done(let written) = status else { throw FixtureError("TLS write: \(status)") }
                count = written
            } else {
                count = bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            }
            guard count > 0 else { throw FixtureError("send: \(errno)") }
            offset += count
        }
    }

    func sendWelcome(sessionID: SessionID, keepAlive: UInt32 = 600, ackedSeq: UInt64 = 0, resumed: Bool = false) throws {
        try send(.welcome(Welcome(
            sessionID: sessionID, resumed: resumed, keepAliveSeconds: keepAlive,
            idleTimeoutSeconds: KeepAliveIdle.idleTimeout(keepAlive), serverTime: 1_800_000_000_000,
            maxFrameLength: 65_536, ackedSeq: ackedSeq)))
    }

    func sendEvent(seq: UInt64, _ event: Event) throws { try send(.event(seq: seq, event)) }

    /// The next frame, or an error when none arrives in time or the client closed.
    func readFrame(within timeout: Duration = .seconds(5)) throws -> Frame {
        let deadline = SystemClock().now() + timeout
        while true {
            do {
                if let frame = try assembler.next() { return frame }
            } catch {
                throw FixtureError("bad frame: \(error)")
            }
            let now = SystemClock().now()
            guard now < deadline, readable(within: deadline - now) else { throw FixtureError("no frame within \(timeout)") }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = receive(into: &chunk)
            guard count > 0 else { throw FixtureError("client closed the connection") }
            assembler.append(contentsOf: chunk[0..<count])
        }
    }

    /// Reads frames until one matches; frames before it are returned too.
    func readUntil(within timeout: Duration = .seconds(5), _ matches: (Frame) -> Bool) throws -> (Frame, skipped: [Frame]) {
        var skipped: [Frame] = []
        let deadline = SystemClock().now() + timeout
        while true {
            let remaining = deadline - SystemClock().now()
            let frame = try readFrame(within: remaining)
            if matches(frame) { return (frame, skipped) }
            skipped.append(frame)
        }
    }

    func expectHello(within timeout: Duration = .seconds(5)) throws -> Hello {
        guard case .hello(let hello) = try readFrame(within: timeout) else { throw FixtureError("expected HELLO") }
        return hello
    }

    /// Reads until the client closes (EOF or reset); frames read meanwhile are returned.
    func waitForClose(within timeout: Duration = .seconds(5)) throws -> [Frame] {
        var frames: [Frame] = []
        let deadline = SystemClock().now() + timeout
        while true {
            let now = SystemClock().now()
            guard now < deadline, readable(within: deadline - now) else { throw FixtureError("client did not close within \(timeout)") }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = receive(into: &chunk)
            if count <= 0 { return frames }
            assembler.append(contentsOf: chunk[0..<count])
            // Bad bytes end the list, as before: the test looks at the frames that came first.
            while let frame = try? assembler.next() { frames.append(frame) }
        }
    }
}

enum KeepAliveIdle {
    static func idleTimeout(_ interval: UInt32) -> UInt32 { interval + (interval + 1) / 2 }
}

/// True when `fd` became readable within `timeout`.
func waitReadable(_ fd: Int32, _ timeout: Duration) -> Bool {
    var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    let deadline = SystemClock().now() + timeout
    while true {
        let remaining = deadline - SystemClock().now()
        let result = poll(&entry, 1, Int32(clamping: max(0, remaining.milliseconds)))
        if result < 0 && errno == EINTR { continue }
        return result > 0
    }
}
