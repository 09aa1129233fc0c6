import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Reads standard input on a thread of its own and hands each chunk to `deliver` (an
/// empty chunk means end of input, after which the thread ends). Polls a wake-up pipe
/// beside the descriptor, so `stop` ends it at once.
final class InputReader: Sendable {
    private let fd: Int32
    private let wake: WakePipe
    private let done = DispatchSemaphore(value: 0)
    private let deliver: @Sendable ([UInt8]) -> Void

    init(fd: Int32 = 0, deliver: @escaping @Sendable ([UInt8]) -> Void) throws(SystemError) {
        self.fd = fd
        wake = try WakePipe()
        self.deliver = deliver
    }

    func start() {
        let thread = Thread { [self] in
            defer { done.signal() }
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                           pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0)]
                if poll(&fds, 2, -1) < 0 {
                    if errno == EINTR { continue }
                    deliver([])
                    return
                }
                if fds[1].revents != 0 { return }
                guard fds[0].revents != 0 else { continue }
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                if count <= 0 {
                    deliver([])
                    return
                }
                deliver(Array(buffer[0..<count]))
            }
        }
        thread.name = "voipclient-input"
        thread.start()
    }

    /// Ends the thread (waits for it, at most a second).
    func stop() {
        wake.signal()
        _ = done.wait(timeout: .now() + 1)
    }
}
