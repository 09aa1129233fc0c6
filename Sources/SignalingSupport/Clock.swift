import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A point on a monotonic timeline, in nanoseconds. Only differences are meaningful.
public struct Instant: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: UInt64

    public init(nanoseconds: UInt64) { self.nanoseconds = nanoseconds }

    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    public func adding(_ duration: Duration) -> Instant {
        let (seconds, attoseconds) = duration.components
        let delta = Int64(seconds) * 1_000_000_000 + attoseconds / 1_000_000_000
        return Instant(nanoseconds: UInt64(max(0, Int64(nanoseconds) + delta)))
    }

    public static func + (a: Instant, b: Duration) -> Instant { a.adding(b) }

    /// `self` plus `nanoseconds` (a duration worked out once, `Duration.wholeNanoseconds`).
    /// `+` reads the duration through `Duration.components`, 128-bit arithmetic of about
    /// 190 instructions: too much for a path every message takes (callgrind, issue 16).
    /// Saturates at the end of the timeline (a duration clamped to `UInt64.max`).
    public func adding(nanoseconds delta: UInt64) -> Instant {
        let (sum, overflow) = nanoseconds.addingReportingOverflow(delta)
        return Instant(nanoseconds: overflow ? .max : sum)
    }

    /// Whole seconds from `earlier` to this instant, rounded down; 0 if `earlier` is later.
    /// Integer arithmetic, where `(self - earlier).seconds` costs as much as `+` does.
    public func wholeSeconds(since earlier: Instant) -> UInt64 {
        nanoseconds >= earlier.nanoseconds ? (nanoseconds - earlier.nanoseconds) / 1_000_000_000 : 0
    }

    /// `a - b`, never negative.
    public static func - (a: Instant, b: Instant) -> Duration {
        a.nanoseconds >= b.nanoseconds ? .nanoseconds(Int64(a.nanoseconds - b.nanoseconds)) : .zero
    }

    public var description: String { "\(Double(nanoseconds) / 1e9)s" }
}

extension Duration {
    /// The duration in (fractional) seconds.
    public var seconds: Double {
        let (s, atto) = components
        return Double(s) + Double(atto) / 1e18
    }

    /// The duration in whole nanoseconds, rounded down, clamped to 0 and to `UInt64.max`
    /// (for `Instant.adding(nanoseconds:)`).
    public var wholeNanoseconds: UInt64 {
        let (s, atto) = components
        guard s >= 0 else { return 0 }
        let (whole, overflow) = UInt64(s).multipliedReportingOverflow(by: 1_000_000_000)
        let (sum, carry) = whole.addingReportingOverflow(UInt64(max(0, atto / 1_000_000_000)))
        return overflow || carry ? .max : sum
    }

    /// The duration in whole milliseconds, rounded down, clamped to 0.
    public var milliseconds: Int64 {
        let (s, atto) = components
        return max(0, s * 1000 + atto / 1_000_000_000_000_000)
    }
}

/// Where every component reads time. Production uses `SystemClock`; tests inject a
/// `ManualClock` so a 600 s keep-alive or a 60 s ring timeout passes in microseconds.
public protocol Clock: Sendable {
    /// Monotonic time: for timeouts and intervals.
    func now() -> Instant
    /// Wall-clock time in ms since the Unix epoch: for timestamps shown to users.
    func wallMilliseconds() -> UInt64
}

/// The real clocks: CLOCK_MONOTONIC and CLOCK_REALTIME.
public struct SystemClock: Clock {
    public init() {}

    public func now() -> Instant {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Instant(nanoseconds: UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec))
    }

    public func wallMilliseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UInt64(ts.tv_sec) * 1000 + UInt64(ts.tv_nsec) / 1_000_000
    }

    /// Sleeps until `deadline` on this clock's timeline (at once if it has passed).
    /// Signals do not cut the sleep short.
    public func sleep(until deadline: Instant) {
        var when = timespec(tv_sec: Int(deadline.nanoseconds / 1_000_000_000), tv_nsec: Int(deadline.nanoseconds % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &when, nil) == EINTR {}
    }
}

/// A clock that moves only when told to. Thread-safe: tests advance it from their own
/// thread while event loops read it.
public final class ManualClock: Clock {
    private struct State {
        var monotonic: UInt64
        var wall: UInt64
    }
    private let state: Mutex<State>

    /// Starts at an arbitrary non-zero point so that "time zero" bugs show up.
    public init(start: Instant = Instant(nanoseconds: 1_000_000_000_000), wallMilliseconds: UInt64 = 1_800_000_000_000) {
        state = Mutex(State(monotonic: start.nanoseconds, wall: wallMilliseconds))
    }

    public func now() -> Instant { Instant(nanoseconds: state.withLock { $0.monotonic }) }

    public func wallMilliseconds() -> UInt64 { state.withLock { $0.wall } }

    /// Moves both timelines forward.
    public func advance(by duration: Duration) {
        let nanos = UInt64(max(0, duration.seconds * 1e9))
        state.withLock {
            $0.monotonic += nanos
            $0.wall += nanos / 1_000_000
        }
    }
}

extension Duration {
    /// The duration in whole seconds, rounded up (a deadline kept to the second is never
    /// early), clamped to the range of UInt32.
    public var wholeSecondsRoundedUp: UInt32 {
        UInt32(clamping: Int(seconds.rounded(.up)))
    }

    /// The duration in whole microseconds, rounded down, clamped to 0.
    public var microseconds: Int64 {
        let (s, atto) = components
        return max(0, s * 1_000_000 + atto / 1_000_000_000_000)
    }
}
