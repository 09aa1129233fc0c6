import SignalingSupport
import SignalingTLS
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// What a TLS test client trusts and offers: the CA of `TestCertificates`, the name it
/// checks (and sends as SNI), the versions it accepts, a session to resume.
struct TestTLS {
    var context: TLSClientContext
    var serverName: String? = "localhost"
    var session: TLSSession?

    init(caFile: String, minimumVersion: TLSVersion = .v1_2, alpn: String? = signalingALPN, serverName: String? = "localhost") throws {
        context = try TLSClientContext(caFile: caFile, minimumVersion: minimumVersion, alpn: alpn)
        self.serverName = serverName
    }
}

/// The client side of a TLS connection for the tests, poll-driven on a non-blocking
/// socket with SignalingTLS's client: the handshake at once, then reads and writes that
/// wait (bounded) for the socket like `TestClient`'s plain ones. `TestClient` reads and
/// writes through it when made with `tls:`.
final class TLSTestChannel {
    let connection: TLSConnection
    private let fd: Int32

    /// Completes the handshake on the connected socket `fd` (made non-blocking here), or
    /// throws with OpenSSL's reason (the connection is freed once, by `deinit`).
    init(fd: Int32, _ tls: TestTLS, timeout: Duration = .seconds(10)) throws {
        try SocketCalls.setNonBlocking(fd)
        guard let connection = TLSConnection.connecting(fd: fd, context: tls.context, serverName: tls.serverName) else {
            throw TestClient.Failure("cannot start a TLS connection")
        }
        self.connection = connection
        self.fd = fd
        if let session = tls.session { connection.offer(session) }
        let deadline = SystemClock().now() + timeout
        while true {
            let status = connection.handshake()
            switch status {
            case .done: return
            case .wantRead, .wantWrite:
                let remaining = deadline - SystemClock().now()
                guard remaining > .zero else {
                    throw TestClient.Failure("the TLS handshake did not finish within \(timeout)")
                }
                _ = SocketCalls.wait(
                    fd, for: status == .wantRead ? Int16(POLLIN) : Int16(POLLOUT), milliseconds: Int32(clamping: max(1, remaining.milliseconds)))
            case .closed:
                throw TestClient.Failure("the server closed the connection during the TLS handshake")
            case .failed(let error):
                throw TestClient.Failure("TLS handshake failed: \(error.message)")
            }
        }
    }

    deinit { connection.free() }

    /// Writes some of `bytes` now (`.wouldBlock`: the socket is full; EPIPE: the
    /// connection failed).
    func send(_ bytes: UnsafeRawBufferPointer) -> IOResult {
        switch connection.write(bytes) {
        case .done(let count): return .transferred(count)
        case .wantRead, .wantWrite: return .wouldBlock
        case .closed, .failed: return .failed(errno: EPIPE)
        }
    }

    /// Reads what arrives within `milliseconds`: the count (0 at the end of the stream),
    /// `.wouldBlock` when nothing came, ECONNRESET when the connection failed.
    func receive(into buffer: UnsafeMutableRawBufferPointer, milliseconds: Int64) -> IOResult {
        let deadline = SystemClock().now() + .milliseconds(milliseconds)
        while true {
            let status = connection.read(into: buffer)
            switch status {
            case .done(let count): return .transferred(count)
            case .closed: return .transferred(0)
            case .failed: return .failed(errno: ECONNRESET)
            case .wantRead, .wantWrite:
                let remaining = deadline - SystemClock().now()
                guard remaining > .zero,
                      SocketCalls.wait(fd, for: status == .wantRead ? Int16(POLLIN) : Int16(POLLOUT),
                                       milliseconds: Int32(clamping: max(1, remaining.milliseconds)))
                else { return .wouldBlock }
            }
        }
    }

    /// Input waiting in OpenSSL (the socket's poll does not show it).
    var hasPendingBytes: Bool { connection.hasBufferedInput }
}
