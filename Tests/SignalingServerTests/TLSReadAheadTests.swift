import Foundation
import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import SignalingTLS
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The server's TLS context reads ahead (one read(2) takes a record's header, its body and
/// whatever follows), and a readable event ends once OpenSSL holds no more input. These
/// tests cut the device's record stream at every byte and make sure that the server has
/// read the first part before the second is sent: every partial record, every partial
/// frame and every pipelined one must still be decoded, and answered, exactly once.
/// (A server that handled one record per readable event would leave the last record in
/// OpenSSL's buffer, announced by no event, at most cuts.)
@Suite("TLS records split at every byte on the reading-ahead server")
struct TLSReadAheadTests {
    @Test("HELLO and pipelined requests in three records, cut at every byte: each cut is read in two parts and every frame is answered once")
    func recordsCutAtEveryByte() throws {
        let certificates = try TestCertificates()
        let server = try TestServer { TestServer.tls(certificates, &$0) }
        let client = try TLSClientContext(caFile: certificates.caFile)
        var cut = 1
        var cuts = 0
        while true {
            let device = try RelayedTLSDevice(port: server.tlsPort, context: client)
            // Frames: HELLO, PING, MESSAGE_SEND, PING. Records: the first half of HELLO; the
            // rest of HELLO, PING and the start of MESSAGE_SEND; the rest of it and PING.
            let hello = FrameEncoder.encode(.hello(Hello(userID: String(format: "split-%05d", cut), deviceID: "d1")))
            let message = FrameEncoder.encode(.request(id: 1, .messageSend(OutgoingMessage(
                messageID: "m1", recipient: "nobody-online", contentType: "text/plain", body: Array("pipelined".utf8)))))
            let ping = FrameEncoder.encode(.ping)
            let records = [
                Array(hello[..<(hello.count / 2)]),
                Array(hello[(hello.count / 2)...]) + ping + Array(message[..<10]),
                Array(message[10...]) + ping,
            ]
            let wire = try device.encrypt(records)
            #expect(wire.count > records.joined().count + 3 * 5, "three records, each with its header and tag")
            guard cut < wire.count else { break }

            try device.sendToServer(wire[..<cut])
            try device.waitUntilServerRead()
            try device.sendToServer(wire[cut...])
            let replies = try device.frames(count: 4)
            // The message's OK and the second PONG in either order: replies carry no order
            // (docs/PROTOCOL.md, section 6), and a message to another shard's user is
            // answered by that shard's loop, through the sender's loop's inbox.
            let okThenPong = replies.count == 4 && replies[3] == .pong && { if case .ok(1, _) = replies[2] { true } else { false } }()
            let pongThenOK = replies.count == 4 && replies[2] == .pong && { if case .ok(1, _) = replies[3] { true } else { false } }()
            guard replies.count == 4, case .welcome = replies[0], replies[1] == .pong, okThenPong || pongThenOK else {
                Issue.record("cut at byte \(cut) of \(wire.count): \(replies)")
                return
            }
            // A marker request: its OK must be the very next frame (nothing answered twice).
            let marker = FrameEncoder.encode(.request(id: 2, .messageSend(OutgoingMessage(
                messageID: "m2", recipient: "nobody-online", contentType: "text/plain", body: Array("marker".utf8)))))
            try device.sendToServer(try device.encrypt([marker])[...])
            let next = try device.frames(count: 1)
            guard case .ok(2, _)? = next.first else {
                Issue.record("cut at byte \(cut): after the four replies came \(next), not the marker's OK")
                return
            }
            cut += 1
            cuts += 1
        }
        #expect(cuts > 100)
    }
}

/// A device whose TLS records pass through the test on their way to the server: the client's
/// TLSConnection writes to one end of a socket pair, and the test forwards what comes out
/// of the other end to the server's TCP socket, cut where it likes, and the server's bytes
/// back. It also finds the server's side of the TCP connection (same process) to see when
/// the server has read what was sent.
private final class RelayedTLSDevice {
    private let tcp: Int32
    private let local: Int32, wire: Int32
    private let connection: TLSConnection
    private let serverSide: Int32
    private var assembler = FrameAssembler(maxFrameLength: 1 << 20)

    init(port: UInt16, context: TLSClientContext) throws {
        tcp = try SocketCalls.openTCP(nonBlocking: false)
        _ = try SocketCalls.connect(tcp, SocketCalls.socketAddress(0x7F00_0001, port: port))
        try SocketCalls.setNonBlocking(tcp)
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0 else {
            throw SystemError("socketpair", errno)
        }
        (local, wire) = (fds[0], fds[1])
        connection = TLSConnection.connecting(fd: local, context: context, serverName: "localhost")!
        serverSide = try Self.acceptedSocket(peerOf: tcp)
        try handshake()
    }

    deinit {
        connection.free()
        close(tcp)
        close(local)
        close(wire)
    }

    /// The records `records` become on the wire: one TLS write each, so one record each.
    func encrypt(_ records: [[UInt8]]) throws -> [UInt8] {
        for record in records {
            let status = record.withUnsafeBytes { connection.write($0) }
            guard status == .done(record.count) else { throw TestClient.Failure("TLS write: \(status)") }
        }
        return drain(wire)
    }

    func sendToServer(_ bytes: ArraySlice<UInt8>) throws {
        try bytes.withUnsafeBytes { try SocketCalls.sendAll(tcp, $0) }
    }

    /// Waits until the server's socket has nothing left to read: the server took the bytes
    /// (into OpenSSL's read-ahead buffer, or further).
    func waitUntilServerRead(timeout: Duration = .seconds(5)) throws {
        let deadline = SystemClock().now() + timeout
        while true {
            var unread: Int32 = 0
            guard ioctl(serverSide, UInt(FIONREAD), &unread) == 0 else { throw SystemError("ioctl FIONREAD", errno) }
            if unread == 0 { return }
            guard SystemClock().now() < deadline else { throw TestClient.Failure("the server left \(unread) bytes unread") }
            _ = SocketCalls.wait(-1, for: 0, milliseconds: 1)
        }
    }

    /// The next `count` frames from the server (fewer if the deadline passes first).
    func frames(count: Int, timeout: Duration = .seconds(5)) throws -> [Frame] {
        var frames: [Frame] = []
        let deadline = SystemClock().now() + timeout
        while frames.count < count, SystemClock().now() < deadline {
            if let frame = try assembler.next() {
                frames.append(frame)
                continue
            }
            try pump(milliseconds: 10)
            assembler.append(contentsOf: readPlaintext())
        }
        return frames
    }

    // MARK: Private

    private func handshake(timeout: Duration = .seconds(10)) throws {
        let deadline = SystemClock().now() + timeout
        while true {
            let status = connection.handshake()
            switch status {
            case .done:
                // The client's Finished goes to the server now, so that the records that
                // follow are the device's frames only.
                try pump(milliseconds: 0)
                return
            case .wantRead, .wantWrite:
                guard SystemClock().now() < deadline else { throw TestClient.Failure("the TLS handshake did not finish") }
                try pump(milliseconds: 10)
            default: throw TestClient.Failure("TLS handshake: \(status)")
            }
        }
    }

    /// Forwards what either side has written, waiting up to `milliseconds` for the server.
    private func pump(milliseconds: Int32) throws {
        let outgoing = drain(wire)
        if !outgoing.isEmpty { try sendToServer(outgoing[...]) }
        _ = SocketCalls.wait(tcp, for: Int16(POLLIN), milliseconds: milliseconds)
        let incoming = drain(tcp)
        if !incoming.isEmpty { try incoming.withUnsafeBytes { try SocketCalls.sendAll(wire, $0) } }
    }

    private func readPlaintext() -> [UInt8] {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while case .done(let count) = buffer.withUnsafeMutableBytes({ connection.read(into: $0) }) {
            received += buffer[..<count]
        }
        return received
    }

    /// Everything `fd` (non-blocking) has now.
    private func drain(_ fd: Int32) -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while case .transferred(let count) = buffer.withUnsafeMutableBytes({ SocketCalls.receive(fd, into: $0) }), count > 0 {
            bytes += buffer[..<count]
        }
        return bytes
    }

    /// The server's descriptor for the TCP connection `client` made: the socket in this
    /// process whose local address is `client`'s peer and whose peer is `client`.
    private static func acceptedSocket(peerOf client: Int32, timeout: Duration = .seconds(5)) throws -> Int32 {
        let (clientLocal, clientPeer) = (address(client, peer: false), address(client, peer: true))
        let deadline = SystemClock().now() + timeout
        while SystemClock().now() < deadline {
            let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            for fd in open.compactMap(Int32.init) where fd != client {
                if let local = address(fd, peer: false), local == clientPeer, let peer = address(fd, peer: true), peer == clientLocal {
                    return fd
                }
            }
            _ = SocketCalls.wait(-1, for: 0, milliseconds: 1)
        }
        throw TestClient.Failure("the server did not accept the connection")
    }

    /// An IPv4 socket's local or peer address and port, nil for anything else.
    private static func address(_ fd: Int32, peer: Bool) -> [UInt8]? {
        var storage = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let result = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { peer ? getpeername(fd, $0, &length) : getsockname(fd, $0, &length) }
        }
        guard result == 0, storage.sin_family == sa_family_t(AF_INET) else { return nil }
        return withUnsafeBytes(of: storage.sin_addr) { Array($0) } + withUnsafeBytes(of: storage.sin_port) { Array($0) }
    }
}
