import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// A level-triggered epoll set whose entries carry a 64-bit token (a subscriber number).
/// The C shim copies ready entries into two plain arrays, so Swift never touches the
/// packed `struct epoll_event` (the same shim voipload uses).
final class EpollSet: @unchecked Sendable {
    static let input = UInt32(VOIPLOAD_EPOLLIN)
    static let output = UInt32(VOIPLOAD_EPOLLOUT)
    static let error = UInt32(VOIPLOAD_EPOLLERR)
    static let hangUp = UInt32(VOIPLOAD_EPOLLHUP)

    let fd: Int32
    private let tokens: UnsafeMutableBufferPointer<UInt64>
    private let readiness: UnsafeMutableBufferPointer<UInt32>

    init(capacity: Int = 1024) throws(ProbeError) {
        fd = voipload_epoll_create()
        guard fd >= 0 else { throw ProbeError(call: "epoll_create1") }
        tokens = .allocate(capacity: capacity)
        readiness = .allocate(capacity: capacity)
    }

    deinit {
        close(fd)
        tokens.deallocate()
        readiness.deallocate()
    }

    /// Registers `descriptor`; false (errno set) on failure.
    func add(_ descriptor: Int32, token: UInt64, events: UInt32) -> Bool {
        voipload_epoll_control(fd, descriptor, 0, events, token) == 0
    }

    func modify(_ descriptor: Int32, token: UInt64, events: UInt32) -> Bool {
        voipload_epoll_control(fd, descriptor, 1, events, token) == 0
    }

    /// Waits up to `timeoutMilliseconds` and calls `body(token, events)` for each ready entry.
    func wait(timeoutMilliseconds: Int32, _ body: (UInt64, UInt32) -> Void) {
        let count = voipload_epoll_wait(
            fd, tokens.baseAddress, readiness.baseAddress, Int32(tokens.count), timeoutMilliseconds)
        guard count > 0 else { return }
        for index in 0..<Int(count) { body(tokens[index], readiness[index]) }
    }
}
