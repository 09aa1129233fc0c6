import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// A level-triggered epoll set whose entries carry a 64-bit token (a connection slot).
struct Epoll: ~Copyable {
    let fd: Int32
    private var events: UnsafeMutableBufferPointer<epoll_event>

    init(capacity: Int = 1024) throws(SystemError) {
        fd = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard fd >= 0 else { throw SystemError("epoll_create1", errno) }
        events = .allocate(capacity: capacity)
    }

    deinit {
        close(fd)
        events.deallocate()
    }

    static let readable = EPOLLIN.rawValue | EPOLLRDHUP.rawValue
    static let writable = EPOLLOUT.rawValue

    func add(_ descriptor: Int32, token: UInt64, events mask: UInt32) -> Int32 {
        var event = epoll_event()
        event.events = mask
        event.data.u64 = token
        return epoll_ctl(fd, EPOLL_CTL_ADD, descriptor, &event) == 0 ? 0 : errno
    }

    func modify(_ descriptor: Int32, token: UInt64, events mask: UInt32) {
        var event = epoll_event()
        event.events = mask
        event.data.u64 = token
        _ = epoll_ctl(fd, EPOLL_CTL_MOD, descriptor, &event)
    }

    /// Waits up to `timeoutMilliseconds` and calls `body(token, events)` for each ready entry.
    func wait(timeoutMilliseconds: Int32, _ body: (UInt64, UInt32) -> Void) {
        let count = epoll_wait(fd, events.baseAddress, Int32(events.count), timeoutMilliseconds)
        guard count > 0 else { return }
        for index in 0..<Int(count) {
            let event = events[index]
            body(event.data.u64, event.events)
        }
    }
}
