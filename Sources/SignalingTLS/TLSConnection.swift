import COpenSSLShims

/// What one step of a TLS connection came to.
public enum TLSStatus: Sendable, Equatable {
    /// Finished; a read or write moved this many bytes (0 for a handshake or shutdown).
    case done(Int)
    /// Call again once the socket is readable (also while writing: TLS may need to read).
    case wantRead
    /// Call again once the socket is writable (also while reading).
    case wantWrite
    /// The peer closed the connection.
    case closed
    /// A protocol, certificate or socket error; the connection is unusable.
    case failed(TLSError)
}

/// One TLS connection on a connected non-blocking socket, driven by the caller's readiness
/// events: each step returns at once with what it needs next. The socket stays the caller's
/// (to watch and to close); `free()` releases the TLS state, exactly once.
///
/// A plain struct of one pointer so a server keeps one per connection slot in a side table
/// at 8 bytes each. Not thread-safe: one thread drives a connection at a time.
///
/// Idle cost: record buffers are released between records (SSL_MODE_RELEASE_BUFFERS), so
/// an idle handshaken server connection holds only OpenSSL's SSL object and session
/// (measured in docs/LOAD-TESTING.md).
public struct TLSConnection {
    private let raw: OpaquePointer

    private init(raw: OpaquePointer) { self.raw = raw }

    /// The server side of a connection accepted on `fd`. Nil when out of memory.
    public static func accepting(fd: Int32, context: TLSServerContext) -> TLSConnection? {
        vs_tls_new(context.raw, fd, 1, nil).map(TLSConnection.init(raw:))
    }

    /// The client side of a connection made on `fd`, checking the server's certificate
    /// against `serverName` (a DNS name, also sent as SNI, or an IP address); nil checks
    /// the chain only. Nil when out of memory or the name is unusable.
    public static func connecting(fd: Int32, context: TLSClientContext, serverName: String?) -> TLSConnection? {
        vs_tls_new(context.raw, fd, 0, serverName).map(TLSConnection.init(raw:))
    }

    /// Releases the TLS state (not the socket).
    public func free() { vs_tls_free(raw) }

    public func handshake() -> TLSStatus { status(vs_tls_handshake(raw), count: 0) }

    /// Reads decrypted bytes into `buffer`.
    public func read(into buffer: UnsafeMutableRawBufferPointer) -> TLSStatus {
        var count = 0
        let result = vs_tls_read(raw, buffer.baseAddress, buffer.count, &count)
        return status(result, count: count)
    }

    /// Writes some of `bytes` (partial writes happen); a retry after `.wantRead`/`.wantWrite`
    /// may pass the same bytes from another address.
    public func write(_ bytes: UnsafeRawBufferPointer) -> TLSStatus {
        var count = 0
        let result = vs_tls_write(raw, bytes.baseAddress, bytes.count, &count)
        return status(result, count: count)
    }

    /// Sends close_notify, without waiting for the peer's.
    @discardableResult
    public func shutdown() -> TLSStatus { status(vs_tls_shutdown(raw), count: 0) }

    /// True when OpenSSL holds input, decrypted or not (a server reads ahead), that no
    /// readiness event will announce; false when whatever comes next is on the socket.
    public var hasBufferedInput: Bool { vs_tls_has_buffered_input(raw) == 1 }

    /// The negotiated version; nil before the handshake finished.
    public var version: TLSVersion? { TLSVersion(wireValue: vs_tls_version(raw)) }

    /// The negotiated cipher suite's IANA name ("TLS_AES_128_GCM_SHA256"); nil before the
    /// handshake finished.
    public var cipherSuite: String? { vs_tls_cipher_suite(raw).map { String(cString: $0) } }

    /// The negotiated ALPN protocol; nil when none was.
    public var alpn: String? {
        var name = [CChar](repeating: 0, count: 256)
        let length = name.withUnsafeMutableBufferPointer { vs_tls_alpn(raw, $0.baseAddress, $0.count) }
        return length == 0 ? nil : String(nulTerminated: name)
    }

    /// What the last `.failed` step came to, in classes an operator can act on (a server's
    /// metrics and logs name it).
    public var failureClass: TLSFailureClass { TLSFailureClass(vs_tls_failure_kind(raw)) }

    /// True when the handshake resumed an earlier session from a ticket.
    public var resumedSession: Bool { vs_tls_session_reused(raw) == 1 }

    /// SHA-256 of the peer certificate's SubjectPublicKeyInfo (what a pin names: the same
    /// value as `openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256sum`).
    public var peerPublicKeySHA256: [UInt8]? {
        var digest = [UInt8](repeating: 0, count: 32)
        let ok = digest.withUnsafeMutableBufferPointer { vs_tls_peer_public_key_sha256(raw, $0.baseAddress) }
        return ok == 1 ? digest : nil
    }

    /// A copy of the session to offer next time (client side), once the server sent its
    /// ticket (in TLS 1.3 that comes after the handshake, with the first bytes read). The
    /// copy stays resumable however this connection ends (reset, no close_notify).
    public func resumableSession() -> TLSSession? {
        vs_tls_copy_session(raw).map(TLSSession.init(raw:))
    }

    /// Offers `session` for resumption; call before the handshake (client side).
    public func offer(_ session: TLSSession) { _ = vs_tls_offer_session(raw, session.raw) }

    private func status(_ result: vs_tls_status, count: Int) -> TLSStatus {
        switch result {
        case VS_TLS_DONE: return .done(count)
        case VS_TLS_WANT_READ: return .wantRead
        case VS_TLS_WANT_WRITE: return .wantWrite
        case VS_TLS_CLOSED: return .closed
        default:
            var text = [CChar](repeating: 0, count: 512)
            text.withUnsafeMutableBufferPointer { vs_tls_describe_failure(raw, $0.baseAddress, $0.count) }
            return .failed(TLSError(String(nulTerminated: text), isCertificateRejected: vs_tls_failed_verification(raw) == 1))
        }
    }
}

/// Why a TLS step failed, coarsely: the label a server counts failed handshakes under.
public enum TLSFailureClass: String, Sendable, CaseIterable {
    /// The bytes were no TLS at all: the plain protocol, HTTP, a port scanner.
    case notTLS = "not_tls"
    /// No protocol version both sides accept (a client older than `--tls-min-version`).
    case version
    /// The client offered ALPN protocols, none of them ours.
    case alpn
    /// No cipher suite, key-exchange group or signature algorithm in common.
    case cipher
    /// A certificate was refused: the server's by the client (its alert says so: unknown
    /// CA, expired, wrong name), or, on a client, the server's by its own check.
    case certificate
    /// The socket failed (reset, timed out).
    case socket
    /// Anything else OpenSSL refused.
    case other

    init(_ kind: vs_tls_failure_class) {
        switch kind {
        case VS_TLS_FAILURE_NOT_TLS: self = .notTLS
        case VS_TLS_FAILURE_VERSION: self = .version
        case VS_TLS_FAILURE_ALPN: self = .alpn
        case VS_TLS_FAILURE_CIPHER: self = .cipher
        case VS_TLS_FAILURE_CERTIFICATE: self = .certificate
        case VS_TLS_FAILURE_SOCKET: self = .socket
        default: self = .other
        }
    }
}

/// A TLS session a client may resume (a server's ticket). Immutable, shareable.
public final class TLSSession: @unchecked Sendable {
    fileprivate let raw: OpaquePointer

    fileprivate init(raw: OpaquePointer) { self.raw = raw }

    deinit { vs_tls_session_free(raw) }
}
