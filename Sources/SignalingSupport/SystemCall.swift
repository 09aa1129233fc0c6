#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The one place where a system call's -1 and `errno` become a result (like swift-nio's
/// System.swift): an interrupted call (EINTR) is made again, a failure becomes a
/// `SystemError` naming the call, and I/O on a non-blocking descriptor tells "would
/// block" apart from failure. `SocketCalls` builds the socket operations on it; the
/// server, the client library, voipload, voipclient, the probes and the test clients all
/// go through one or the other.
public enum SystemCall {
    /// Makes `call` until it is not interrupted; -1 throws `SystemError(name, errno)`.
    @inlinable @discardableResult
    public static func run<Value: FixedWidthInteger & SignedInteger>(
        _ name: @autoclosure () -> String, _ call: () -> Value
    ) throws(SystemError) -> Value {
        while true {
            let result = call()
            if result != -1 { return result }
            let code = errno
            if code != EINTR { throw SystemError(name(), code) }
        }
    }

    /// Makes a read or write style `call` (a count, or -1 and errno) until it is not
    /// interrupted. For reads, a count of 0 is the end of the stream.
    @inlinable
    public static func io(_ call: () -> Int) -> IOResult {
        while true {
            let count = call()
            if count >= 0 { return .transferred(count) }
            let code = errno
            switch code {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: return .wouldBlock
            default: return .failed(errno: code)
            }
        }
    }

    /// Writes all of `bytes` to a file, pipe or terminal with write(2), retrying
    /// interruptions; false when the descriptor takes nothing more (an error, a full
    /// non-blocking pipe, or a write of 0). For sockets use `SocketCalls.sendAll`.
    @discardableResult
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < bytes.count {
            guard case .transferred(let count) = io({ systemWrite(fd, bytes.baseAddress! + offset, bytes.count - offset) }),
                  count > 0 else { return false }
            offset += count
        }
        return true
    }
}

#if canImport(Glibc)
private let systemWrite = Glibc.write
#elseif canImport(Darwin)
private let systemWrite = Darwin.write
#endif

/// What a read or write on a non-blocking descriptor did.
public enum IOResult: Equatable, Sendable {
    /// Bytes moved; for a read 0 means the peer closed its side (end of stream).
    case transferred(Int)
    /// Nothing moved: try again once the descriptor is ready (EAGAIN, EWOULDBLOCK).
    case wouldBlock
    /// The call failed with this errno (ECONNRESET, EPIPE, ETIMEDOUT...).
    case failed(errno: Int32)
}
