import SignalingSupport
import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// A level-triggered epoll set whose entries carry a 64-bit token (a connection slot).
/// The C shim copies ready entries into plain arrays, so Swift never touches the packed
/// `struct epoll_event`.
public struct Epoll: ~Copyable {
    public let fd: Int32
    private let tokens: UnsafeMutableBufferPointer<UInt64>
    private let readiness: UnsafeMutableBufferPointer<UInt32>

    public init(capacity: Int = 256) throws(SystemError) {
        fd = voipload_epoll_create()
        guard fd >= 0 else { throw SystemError("epoll_create1", errno) }
        tokens = .allocate(capacity: capacity)
        readiness = .allocate(capacity: capacity)
    }

    deinit {
        close(fd)
        tokens.deallocate()
        readiness.deallocate()
    }

    public static let input = UInt32(VOIPLOAD_EPOLLIN)
    public static let output = UInt32(VOIPLOAD_EPOLLOUT)
    public static let error = UInt32(VOIPLOAD_EPOLLERR)
    public static let hangUp = UInt32(VOIPLOAD_EPOLLHUP)
    public static let peerClosed = UInt32(VOIPLOAD_EPOLLRDHUP)
    public static let readable = input | peerClosed
    public static let writable = output

    /// Returns 0 or errno.
    public func add(_ descriptor: Int32, token: UInt64, events mask: UInt32) -> Int32 {
        voipload_epoll_control(fd, descriptor, 0, mask, token) == 0 ? 0 : errno
    }

    /// Returns 0 or errno.
    @discardableResult
    public func modify(_ descriptor: Int32, token: UInt64, events mask: UInt32) -> Int32 {
        voipload_epoll_control(fd, descriptor, 1, mask, token) == 0 ? 0 : errno
    }

    /// Waits up to `timeoutNanoseconds` (negative: no timeout) and calls
    /// `body(token, events)` for each ready entry.
    public func wait(timeoutNanoseconds: Int64, _ body: (UInt64, UInt32) -> Void) {
        let count = voipload_epoll_wait_ns(fd, tokens.baseAddress, readiness.baseAddress, Int32(tokens.count), timeoutNanoseconds)
        guard count > 0 else { return }
        for index in 0..<Int(count) { body(tokens[index], readiness[index]) }
    }

    /// As `wait(timeoutNanoseconds:)`, in milliseconds (negative: no timeout).
    public func wait(timeoutMilliseconds: Int32, _ body: (UInt64, UInt32) -> Void) {
        wait(timeoutNanoseconds: timeoutMilliseconds < 0 ? -1 : Int64(timeoutMilliseconds) * 1_000_000, body)
    }
}
