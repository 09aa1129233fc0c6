import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A descriptor another thread can make readable so that a thread blocked in `poll`
/// wakes at once (the probe's thread, the terminal's input thread). A non-blocking,
/// close-on-exec pipe; one byte per signal is plenty.
final class WakePipe: Sendable {
    let readDescriptor: Int32
    private let writeDescriptor: Int32

    init() throws(SystemError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw SystemError("pipe", errno) }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        readDescriptor = fds[0]
        writeDescriptor = fds[1]
    }

    deinit {
        close(readDescriptor)
        close(writeDescriptor)
    }

    func signal() {
        var byte: UInt8 = 1
        _ = write(writeDescriptor, &byte, 1)
    }

    func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while buffer.withUnsafeMutableBytes({ read(readDescriptor, $0.baseAddress, $0.count) }) > 0 {}
    }
}
