import CLinuxShims
import SignalingProtocol
import SignalingSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A deliberately simple, blocking protocol client for server tests: it speaks raw frames
/// (or raw bytes), so tests can do things a well-behaved client never would. Every wait
/// has a deadline. Made with `tls:`, it completes a TLS handshake first and then carries
/// the same frames through it (`TLSTestChannel`).
final class TestClient: ProtocolClient {
    let fd: Int32
    /// The TLS connection the frames go through (nil: plain TCP).
    private(set) var tls: TLSTestChannel?
    private var assembler = FrameAssembler(maxFrameLength: 16 << 20)
    /// Frames read while waiting for something else; `next` returns them first.
    var skipped: [Frame] = []
    /// Events seen, for assertions about order and duplicates.
    private(set) var lastSeq: UInt64 = 0

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// Connects to 127.0.0.1:port (or `host`), optionally from a given source address.
    /// `receiveWindow` shrinks the socket's receive buffer (and the segment size with it,
    /// so that TCP keeps flowing through the small window instead of crawling): the
    /// server's writes to this client then stop part-way as soon as it stops reading.
    /// With `tls`, the TLS handshake follows the connect, after `proxyHeader` if one is
    /// given (as a load balancer sends it, in clear).
    init(
        port: UInt16, host: String = "127.0.0.1", sourceAddress: String? = nil, receiveWindow: Int32? = nil,
        proxyHeader: [UInt8]? = nil, tls: TestTLS? = nil
    ) throws {
        // Every stored property has its value from here on, so a throw below still runs
        // `deinit`, which closes `fd`: the failure paths must not close it too. (They did,
        // and the second close, in a process where parallel tests open sockets all the
        // time, now and then shut some other test's socket that had just reused the number.)
        fd = try SocketCalls.openTCP(nonBlocking: false)
        if let window = receiveWindow {
            try SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_RCVBUF, window)
            try SocketCalls.setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_MAXSEG, max(536, window / 8))
        }
        if let sourceAddress {
            guard let source = SocketCalls.parseEndpoint("\(sourceAddress):0") else { throw Failure("bad source address \(sourceAddress)") }
            try SocketCalls.bind(fd, SocketCalls.socketAddress(source.address, port: 0))
        }
        guard let server = SocketCalls.parseEndpoint("\(host):\(port)") else { throw Failure("bad host \(host)") }
        _ = try SocketCalls.connect(fd, SocketCalls.socketAddress(server.address, port: server.port))
        if let proxyHeader { try sendRaw(proxyHeader) }
        self.tls = try tls.map { try TLSTestChannel(fd: fd, $0) }
    }

    deinit {
        if let tls { _ = tls.connection.shutdown() }
        if fd >= 0 { close(fd) }
    }

    /// Writes some of `bytes` now (through TLS, if any).
    private func transmit(_ bytes: ArraySlice<UInt8>) -> IOResult {
        bytes.withUnsafeBytes { tls?.send($0) ?? SocketCalls.send(fd, $0, flags: Int32(MSG_DONTWAIT)) }
    }

    func sendRaw(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            switch transmit(bytes[offset...]) {
            case .transferred(let written): offset += written
            case .wouldBlock: _ = waitFor(Int16(POLLOUT), milliseconds: 1000)
            case .failed(let code): throw SystemError("send", code)
            }
        }
    }

    func send(_ frame: Frame) throws { try sendRaw(FrameEncoder.encode(frame)) }

    /// Sends `bytes` over and over until the socket takes nothing for `quiet` (the peer has
    /// stopped reading and every buffer on the way is full). Returns the bytes sent; throws
    /// if the socket still takes bytes after `timeout`, or fails.
    @discardableResult
    func sendUntilBlocked(_ bytes: [UInt8], quiet: Duration = .milliseconds(300), timeout: Duration = .seconds(30)) throws -> Int {
        let deadline = SystemClock().now() + timeout
        var total = 0
        var offset = 0
        while SystemClock().now() < deadline {
            let written: Int
            switch transmit(bytes[offset...]) {
            case .transferred(let count): written = count
            case .wouldBlock:
                if !waitFor(Int16(POLLOUT), milliseconds: Int32(quiet.milliseconds)) { return total }
                continue
            case .failed(let code): throw SystemError("send", code)
            }
            total += written
            offset = (offset + written) % bytes.count
        }
        throw Failure("the peer kept reading for \(timeout)")
    }

    private func waitFor(_ events: Int16, milliseconds: Int32) -> Bool {
        if events == Int16(POLLIN), tls?.hasPendingBytes == true { return true }
        return SocketCalls.wait(fd, for: events, milliseconds: milliseconds)
    }

    /// The next frame from the socket, or nil if the connection ended cleanly first.
    /// Throws on timeout.
    func read(timeout: Duration) throws -> Frame? {
        let deadline = SystemClock().now() + timeout
        while true {
            if let frame = try assembler.next() {
                if case .event(let seq, _) = frame { lastSeq = max(lastSeq, seq) }
                return frame
            }
            let remaining = deadline - SystemClock().now()
            guard remaining > .zero else { throw Failure("timed out waiting for a frame") }
            var chunk = [UInt8](repeating: 0, count: 65536)
            switch receive(into: &chunk, milliseconds: max(1, remaining.milliseconds)) {
            case .transferred(0):
                guard assembler.bufferedCount == 0 else { throw Failure("connection closed mid-frame") }
                return nil
            case .transferred(let count): assembler.append(contentsOf: chunk[..<count])
            case .wouldBlock: continue
            case .failed(ECONNRESET): return nil
            case .failed(let code): throw SystemError("recv", code)
            }
        }
    }

    /// Up to `chunk.count` bytes within `milliseconds` (through TLS, if any); `.wouldBlock`
    /// when nothing arrived.
    private func receive(into chunk: inout [UInt8], milliseconds: Int64) -> IOResult {
        if let tls { return chunk.withUnsafeMutableBytes { tls.receive(into: $0, milliseconds: milliseconds) } }
        guard waitFor(Int16(POLLIN), milliseconds: Int32(clamping: milliseconds)) else { return .wouldBlock }
        return chunk.withUnsafeMutableBytes { SocketCalls.receive(fd, into: $0) }
    }

    /// Sends `request` until it is accepted, under a new id each time from `firstID` on (the
    /// store writer may still be in its retry back-off when the store heals): true once OK,
    /// false after 10 s. Any refusal but storeUnavailable is an issue.
    func requestUntilAccepted(firstID: UInt32, _ request: Request) throws -> Bool {
        let deadline = SystemClock().now() + .seconds(10)
        var attempt = firstID
        while SystemClock().now() < deadline {
            let reply = try self.request(attempt, request)
            if reply.isOK { return true }
            #expect(reply.errorCode == .storeUnavailable)
            attempt += 1
        }
        return false
    }

    /// The server ends the stream (after its CLOSE): nothing but end of stream comes.
    /// True if nothing at all arrives within `window` (the socket stays open and silent).
    func staysSilent(for window: Duration = .milliseconds(100)) throws -> Bool {
        guard assembler.bufferedCount == 0 && skipped.isEmpty else { return false }
        if waitFor(Int16(POLLIN), milliseconds: Int32(window.milliseconds)) { return false }
        return true
    }

    /// True while the server has not closed the connection (nothing pending, no EOF).
    var isOpenAndQuiet: Bool {
        if tls?.hasPendingBytes == true { return false }
        var byte: UInt8 = 0
        return withUnsafeMutableBytes(of: &byte) { SocketCalls.receive(fd, into: $0, flags: Int32(MSG_PEEK | MSG_DONTWAIT)) } == .wouldBlock
    }
}

