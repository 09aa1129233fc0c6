import SignalingSupport
import SignalingProtocol
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a connect-then-mark attempt did not produce a marked, handshaken connection.
public enum ConnectError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The deadline passed; the background attempt was cancelled and cleaned up.
    case timedOut
    /// Nobody listens at the address (ECONNREFUSED).
    case refused(SocketAddress)
    /// The network or host is unreachable, or the connect failed with another errno.
    case unreachable(SocketAddress, errno: Int32)
    /// The host name did not resolve.
    case resolutionFailed(host: String, reason: String)
    /// The server answered HELLO with CLOSE: `close.action` says whether to retry.
    case rejected(Close)
    /// The server's bytes broke the protocol during the handshake.
    case protocolViolation(String)
    /// The server closed the connection before answering HELLO.
    case closedDuringHandshake
    /// A system call failed.
    case socketError(operation: String, errno: Int32)
    /// The client was stopped (`disconnect()` / `shutdown()`) while connecting.
    case cancelled
    /// `connect(timeout:)` was given a timeout that is not positive and finite.
    case invalidTimeout
    /// The client was shut down; create a new one.
    case clientShutDown
    /// The server refused the credentials with action `refreshCredentials` (the token
    /// expired, or its key was retired) and `credentialsProvider` had none to give (or
    /// there is no provider). Retried with back-off: the provider is asked again.
    case credentialsUnavailable(Close)
    /// TLS: the server's certificate failed verification; the text is OpenSSL's reason
    /// ("unable to get local issuer certificate", "certificate has expired", "hostname
    /// mismatch"...). Automatic retries wait `reconnect.certificateFailureDelay`.
    case certificateRejected(String)
    /// TLS: the certificate verified but its public key matches none of the pins;
    /// `presented` is the key's SHA-256 in hex (empty: no certificate). Retried like
    /// `certificateRejected`.
    case pinMismatch(presented: String)
    /// TLS: the handshake failed for another reason (no common version, ALPN refused, a
    /// plain-TCP port, a reset); OpenSSL's words. Retried with the ordinary back-off.
    case tlsHandshakeFailed(String)

    public var description: String {
        switch self {
        case .timedOut: return "timed out"
        case .refused(let address): return "connection refused by \(address)"
        case .unreachable(let address, let code): return "\(address) unreachable: \(String(cString: strerror(code)))"
        case .resolutionFailed(let host, let reason): return "cannot resolve \(host): \(reason)"
        case .rejected(let close): return "rejected by the server: \(close.code) (\(close.code.rawValue)): \(close.message)"
        case .protocolViolation(let message): return "protocol violation: \(message)"
        case .closedDuringHandshake: return "the server closed the connection during the handshake"
        case .socketError(let operation, let code): return "\(operation) failed: \(String(cString: strerror(code)))"
        case .cancelled: return "cancelled"
        case .invalidTimeout: return "the connect timeout must be positive and finite"
        case .clientShutDown: return "the client was shut down"
        case .credentialsUnavailable(let close): return "no fresh credentials after \(close.code) (\(close.code.rawValue)): \(close.message)"
        case .certificateRejected(let reason): return "the server's TLS certificate was rejected: \(reason)"
        case .pinMismatch(let presented):
            return presented.isEmpty ? "the server presented no certificate to check the pins against"
                : "the server's public key (SHA-256 \(presented)) matches none of the pins"
        case .tlsHandshakeFailed(let reason): return "TLS handshake failed: \(reason)"
        }
    }

    /// True when the server's certificate was not accepted (`certificateRejected`,
    /// `pinMismatch`): retrying soon cannot help.
    public var isCertificateFailure: Bool {
        switch self {
        case .certificateRejected, .pinMismatch: return true
        default: return false
        }
    }

    /// True when retrying later may succeed (everything but a server's "stop").
    public var isRetryable: Bool {
        switch self {
        case .rejected(let close): return close.action != .stop
        case .cancelled, .clientShutDown, .invalidTimeout: return false
        default: return true
        }
    }
}

/// A wake-up pipe for a connect attempt or a connection's I/O thread; failing to make one
/// (out of descriptors) fails the connect like any socket error.
func makeWakePipe() throws(ConnectError) -> WakePipe {
    do {
        return try WakePipe()
    } catch {
        throw .socketError(operation: "pipe", errno: error.code)
    }
}
