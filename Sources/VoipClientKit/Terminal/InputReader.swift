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
                guard case .transferred = SystemCall.io({ Int(poll(&fds, 2, -1)) }) else {
                    deliver([])
                    return
                }
                if fds[1].revents != 0 { return }
                guard fds[0].revents != 0 else { continue }
                switch SystemCall.io({ buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }) {
                case .wouldBlock: continue
                case .transferred(let count) where count > 0: deliver(Array(buffer[0..<count]))
                case .transferred, .failed:
                    deliver([])
                    return
                }
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
