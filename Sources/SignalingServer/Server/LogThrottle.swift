import SignalingSupport
import Synchronization

// Lock of this file (docs/ARCHITECTURE.md, "Locks"): `state`, a leaf taken by any loop
// under its `ownership` when it logs a refusal; timed (`SharedLock.logThrottle`).

/// At most one log line per `interval` for one kind of event, with the number of events
/// not logged since the last line: a flood (a client guessing credentials) costs one line
/// a second, and the count still tells how big it was. Shared by every loop.
final class LogThrottle: Sendable {
    private let interval: Duration
    private let state = Mutex<(lastLine: Instant?, suppressed: Int)>((nil, 0))

    init(interval: Duration = .seconds(1)) {
        self.interval = interval
    }

    /// Counts one event. Returns nil when it must not be logged (it is counted instead),
    /// else the number of events suppressed since the last line logged.
    func admit(now: Instant) -> Int? {
        state.withLock(timing: .logThrottle) { state -> Int? in
            if let last = state.lastLine, now - last < interval {
                state.suppressed += 1
                return nil
            }
            defer { state = (now, 0) }
            return state.suppressed
        }
    }
}
