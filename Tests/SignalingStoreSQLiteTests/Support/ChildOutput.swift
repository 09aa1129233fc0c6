import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Reads a child's piped stdout line by line, waiting with poll(2) up to a deadline, never
/// by sleeping.
final class ChildOutput {
    private let descriptor: Int32
    private var pending: [UInt8] = []
    private(set) var lines: [String] = []
    private(set) var reachedEnd = false
    private let clock = SystemClock()

    init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    /// Reads until `condition` holds for the lines so far, the pipe ends, or the deadline
    /// passes. Returns whether the condition holds.
    @discardableResult
    func read(until condition: ([String]) -> Bool, timeoutSeconds: Double) -> Bool {
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while !condition(lines) && !reachedEnd {
            let remaining = deadline - clock.now()
            guard remaining > .zero else { return false }
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(clamping: max(1, remaining.milliseconds)))
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else { continue }
            readAvailable()
        }
        return condition(lines)
    }

    /// Reads everything up to the end of the pipe (the child exited).
    func readToEnd(timeoutSeconds: Double) -> Bool {
        read(until: { _ in false }, timeoutSeconds: timeoutSeconds)
        return reachedEnd
    }

    private func readAvailable() {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        if count < 0 && errno == EINTR { return }
        guard count > 0 else {
            reachedEnd = true  // EOF; an unfinished last line was cut off by the kill
            return
        }
        pending += buffer[0..<count]
        while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
            lines.append(String(decoding: pending[..<newline], as: UTF8.self))
            pending.removeSubrange(...newline)
        }
    }
}
