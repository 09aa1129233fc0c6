import SignalingSupport
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Waiting for one socket with a real-time deadline and a cancel signal: the building
/// block of the blocking connect and handshake on the connect thread.
enum PollWait {
    enum Result { case ready, cancelled, timedOut }

    /// Waits until `descriptor` has one of `events`, `cancel` is signalled, or the
    /// monotonic clock passes `deadline`. EINTR is retried with the remaining time.
    static func wait(for descriptor: Int32, events: Int16, cancel: WakePipe, deadline: Instant) -> Result {
        let clock = SystemClock()
        while true {
            let now = clock.now()
            guard now < deadline else { return .timedOut }
            let remaining = deadline - now
            let milliseconds = Int32(clamping: max(1, (remaining.milliseconds)))
            var fds = [
                pollfd(fd: descriptor, events: events, revents: 0),
                pollfd(fd: cancel.readDescriptor, events: Int16(POLLIN), revents: 0),
            ]
            // Not `SystemCall.io`: after an interruption the wait is made again with the
            // time that remains, not the whole of it.
            let count = poll(&fds, nfds_t(fds.count), milliseconds)
            if count < 0 {
                if errno == EINTR { continue }
                return .ready  // let the following I/O call report the error
            }
            if fds[1].revents != 0 { return .cancelled }
            if fds[0].revents != 0 { return .ready }
        }
    }
}
