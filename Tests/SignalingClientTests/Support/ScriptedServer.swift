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
        let fd = try SocketCalls.openTCP(family: family, nonBlocking: false)
        do {
            try SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_REUSEADDR, Int32(1))
            let address = try SocketAddress.resolve(host: host, port: 0)[0].withPort(0)
            try SystemCall.run("bind \(host)") { address.withSockaddr { bind(fd, $0, $1) } }
            try SystemCall.run("listen") { listen(fd, 16) }
        } catch {
            close(fd)
            throw error
        }
        descriptor = fd
        port = SocketHandle(descriptor: dup(fd)).localAddress()!.port
    }

    deinit { close(descriptor) }

    /// Accepts the next connection.
    func accept(within timeout: Duration = .seconds(5)) throws -> PeerConnection {
        guard waitReadable(descriptor, timeout) else { throw FixtureError("no connection within \(timeout)") }
        // Close-on-exec: tests on other threads spawn processes, which must not hold it.
        guard let fd = try SocketCalls.accept(descriptor) else { throw FixtureError("accept: the connection went away") }
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
        let limit = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: Int(timeout.components.attoseconds / 1_000_000_000_000))
        try? SocketCalls.setOption(descriptor, level: SOL_SOCKET, name: SO_RCVTIMEO, limit)
        try? SocketCalls.setOption(descriptor, level: SOL_SOCKET, name: SO_SNDTIMEO, limit)
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
        guard let tls else {
            guard case .transferred(let count) = chunk.withUnsafeMutableBytes({ SocketCalls.receive(descriptor, into: $0) }) else { return -1 }
            return count
        }
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
        try? SocketCalls.setOption(descriptor, level: SOL_SOCKET, name: SO_LINGER, linger(l_onoff: 1, l_linger: 0))
        close()
    }

    func send(_ frame: Frame) throws { try sendRaw(FrameEncoder.encode(frame)) }

    func sendRaw(_ bytes: [UInt8]) throws {
        guard let tls else {
            try bytes.withUnsafeBytes { bytes in Result { () throws(SystemError) in try SocketCalls.sendAll(descriptor, bytes) } }.get()
            return
        }
        var offset = 0
        while offset < bytes.count {
            let status = bytes.withUnsafeBytes { tls.write(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
            guard case .done(let written) = status, written > 0 else { throw FixtureError("TLS write: \(status)") }
            offset += written
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
    let deadline = SystemClock().now() + timeout
    while true {
        let remaining = deadline - SystemClock().now()
        if SocketCalls.wait(fd, for: Int16(POLLIN), milliseconds: Int32(clamping: max(0, remaining.milliseconds))) { return true }
        if remaining <= .zero { return false }
    }
}
