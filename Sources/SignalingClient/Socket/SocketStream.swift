import SignalingSupport
import SignalingTLS
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The bytes of one connected, non-blocking socket, in clear or through TLS: what the
/// handshake and the connection's I/O thread read and write. Both paths answer in the same
/// terms (bytes moved, wait for readiness, closed, failed), so the code above them is one.
///
/// Ownership moves from thread to thread like the socket's (the connect thread, the thread
/// that marks it, the I/O thread) and only one uses it at a time, which is why it is
/// `@unchecked Sendable`; `close()` is the one call that may come twice, and is guarded.
final class SocketStream: @unchecked Sendable {
    let socket: SocketHandle
    /// The TLS state; nil for plain TCP.
    private let tls: TLSConnection?
    private let released = Mutex(false)

    /// What one read or write came to.
    enum Step: Equatable {
        /// Moved this many bytes (more than 0).
        case moved(Int)
        /// Nothing now: call again once the socket is readable (`.readable`) or writable.
        /// TLS may need to write while reading and read while writing.
        case wait(Readiness)
        /// The peer closed the stream (EOF, TLS close_notify).
        case closed
        case failed(Failure)
    }

    enum Readiness: Equatable {
        case readable, writable

        var pollEvents: Int16 { self == .readable ? Int16(POLLIN) : Int16(POLLOUT) }
    }

    enum Failure: Equatable, CustomStringConvertible {
        case socket(errno: Int32)
        case tls(TLSError)

        var description: String {
            switch self {
            case .socket(let code): return String(cString: strerror(code))
            case .tls(let error): return "TLS: \(error.message)"
            }
        }
    }

    /// Plain TCP.
    init(plain socket: SocketHandle) {
        self.socket = socket
        self.tls = nil
    }

    /// TLS on `socket`; the stream frees `tls` when it closes. The connect thread completes
    /// the handshake before the stream goes anywhere else.
    init(socket: SocketHandle, tls: TLSConnection) {
        self.socket = socket
        self.tls = tls
    }

    deinit { release(sendingCloseNotify: false) }

    var isTLS: Bool { tls != nil }

    /// Input inside OpenSSL that no poll will announce: read it before polling. Always false
    /// for plain TCP.
    var hasBufferedInput: Bool { tls?.hasBufferedInput ?? false }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> Step {
        if let tls { return Self.step(tls.read(into: buffer)) }
        switch socket.receive(into: buffer) {
        case .transferred(0): return .closed
        case .transferred(let count): return .moved(count)
        case .wouldBlock: return .wait(.readable)
        case .failed(let code): return .failed(.socket(errno: code))
        }
    }

    func write(_ bytes: UnsafeRawBufferPointer) -> Step {
        guard bytes.count > 0 else { return .moved(0) }
        if let tls { return Self.step(tls.write(bytes)) }
        switch socket.send(bytes) {
        case .transferred(let count): return .moved(count)
        case .wouldBlock: return .wait(.writable)
        case .failed(let code): return .failed(.socket(errno: code))
        }
    }

    /// Sends TLS close_notify (best effort, without waiting for the peer's), releases the
    /// TLS state and closes the socket. Later calls do nothing.
    func close() { release(sendingCloseNotify: true) }

    private func release(sendingCloseNotify: Bool) {
        let first = released.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        guard first else { return }
        if let tls {
            if sendingCloseNotify { tls.shutdown() }
            tls.free()
        }
        socket.close()
    }

    /// What the handshake negotiated; nil for plain TCP.
    var tlsDetails: TLSSessionDetails? {
        guard let tls, let version = tls.version else { return nil }
        return TLSSessionDetails(version: version, alpn: tls.alpn, resumed: tls.resumedSession)
    }

    /// The session the server's ticket established (TLS 1.3 sends it after the handshake,
    /// so it is there once the first bytes were read); nil for plain TCP or before a ticket.
    func resumableTLSSession() -> TLSSession? { tls?.resumableSession() }

    private static func step(_ status: TLSStatus) -> Step {
        switch status {
        case .done(let count): return .moved(count)
        case .wantRead: return .wait(.readable)
        case .wantWrite: return .wait(.writable)
        case .closed: return .closed
        case .failed(let error): return .failed(.tls(error))
        }
    }
}

/// Threads that write to sockets through OpenSSL block SIGPIPE for themselves: OpenSSL
/// writes with write(2), not send(MSG_NOSIGNAL), and a write to a connection the peer
/// reset would otherwise kill the app. The signal is thread-directed, so it stays pending
/// on the blocked thread (and vanishes with it); the write fails with EPIPE as it should.
/// The process's own disposition is left alone.
enum BrokenPipeSignal {
    static func blockOnThisThread() {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }
}
