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
