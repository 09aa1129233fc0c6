#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A descriptor another thread can make readable, so that a thread blocked in `poll`
/// wakes at once (a connect attempt being cancelled, an I/O thread given data, a probe or
/// terminal thread told to stop). A non-blocking, close-on-exec pipe: portable, and one
/// byte per signal is plenty. (The server's loops use an eventfd instead.)
public final class WakePipe: Sendable {
    /// The descriptor to poll for POLLIN.
    public let readDescriptor: Int32
    private let writeDescriptor: Int32

    public init() throws(SystemError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw SystemError("pipe", errno) }
        for fd in fds {
            try? SocketCalls.setNonBlocking(fd)
            try? SocketCalls.setCloseOnExec(fd)
        }
        readDescriptor = fds[0]
        writeDescriptor = fds[1]
    }

    deinit {
        close(readDescriptor)
        close(writeDescriptor)
    }

    /// Makes `readDescriptor` readable until `drain` (a full pipe is already readable, so
    /// a failed write loses nothing).
    public func signal() {
        var byte: UInt8 = 1
        _ = write(writeDescriptor, &byte, 1)
    }

    /// True when signalled and not drained since (does not consume the signal).
    public var isSignalled: Bool {
        var fd = pollfd(fd: readDescriptor, events: Int16(POLLIN), revents: 0)
        return poll(&fd, 1, 0) > 0 && fd.revents != 0
    }

    /// Consumes pending signals.
    public func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while buffer.withUnsafeMutableBytes({ read(readDescriptor, $0.baseAddress, $0.count) }) > 0 {}
    }
}
