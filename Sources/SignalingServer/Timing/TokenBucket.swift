import SignalingSupport
import Synchronization

/// A token bucket: admits `rate` operations per second on average, with bursts up to
/// `burst`. Paces each sender (`SwitchboardState.admitSender`, under its shard's lock).
/// Not thread-safe on its own; `SharedTokenBucket` is the same bucket for many threads.
///
/// Its whole state is one instant (the generic cell rate algorithm's "theoretical arrival
/// time"): the bucket is full at any instant at or after `full`, and holds
/// `burst - (full - now) / interval` tokens before it. Taking a token moves `full` one
/// interval later; time passing refills it by itself. That is exactly the bucket of
/// fractional tokens refilled at `rate` and capped at `burst`, in one word, so that the
/// shared bucket can change it with one compare-and-exchange (`Pace.take` is the only copy
/// of the arithmetic).
struct TokenBucket {
    let pace: Pace
    private var full: UInt64

    /// The rate and burst in the nanoseconds the arithmetic uses.
    struct Pace: Equatable, Sendable {
        /// Nanoseconds per token; 0: unlimited.
        let interval: UInt64
        /// How far `full` may be ahead of now for a token to be left: `burst - 1` intervals.
        let tolerance: UInt64

        /// `rate` 0 means unlimited; `burst` is at least 1.
        init(rate: Double, burst: Double) {
            guard rate > 0 else {
                self.interval = 0
                self.tolerance = 0
                return
            }
            self.interval = max(1, UInt64((1e9 / rate).rounded()))
            self.tolerance = UInt64(((max(1, burst) - 1) * 1e9 / rate).rounded())
        }

        init(interval: UInt64, tolerance: UInt64) {
            self.interval = interval
            self.tolerance = tolerance
        }

        /// Where `full` moves when a token is taken at `now` from a bucket full at `full`,
        /// or nil when no token is left (the bucket is unchanged). Not for an unlimited
        /// pace (`interval` 0), whose callers take without looking.
        @inline(__always)
        func take(from full: UInt64, at now: UInt64) -> UInt64? {
            let start = max(full, now)  // a bucket full since before now holds `burst`, no more
            guard start - now <= tolerance else { return nil }
            return start + interval
        }
    }

    /// `rate` 0 means unlimited. Starts full.
    init(rate: Double, burst: Double, now: Instant) {
        self.pace = Pace(rate: rate, burst: burst)
        self.full = now.nanoseconds
    }

    /// Takes one token if there is one.
    mutating func tryTake(now: Instant) -> Bool {
        guard pace.interval > 0 else { return true }
        guard let next = pace.take(from: full, at: now.nanoseconds) else { return false }
        full = next
        return true
    }
}

/// A `TokenBucket` that every loop takes from without a lock (the handshake bucket of
/// `AdmissionControl`): its one instant is an atomic word changed by compare-and-exchange,
/// retried when another thread took a token first. A thread preempted in the middle holds
/// nobody up; under contention a take costs one more round trip of the word's cache line
/// per retry. An unlimited pace writes nothing.
///
/// The pace may change at run time (`reset`, on a reload): it is one word too, the
/// interval and the tolerance in 32 bits each (so at most 4.29 s each: a rate of at
/// least one a second with a burst of at most one second's worth, as the handshake rate
/// is). A take that read the old pace right before a reset may pass once more under it.
final class SharedTokenBucket: Sendable {
    /// `TokenBucket.full`.
    private let full = Atomic<UInt64>(0)
    /// `Pace.interval` in the low 32 bits, `tolerance` in the high ones.
    private let pace = Atomic<UInt64>(0)

    init(rate: Double, burst: Double, now: Instant) {
        reset(rate: rate, burst: burst, now: now)
    }

    /// The pace in force.
    var currentPace: TokenBucket.Pace {
        let word = pace.load(ordering: .relaxed)
        return TokenBucket.Pace(interval: word & 0xFFFF_FFFF, tolerance: word >> 32)
    }

    /// Puts a new pace in force, with a full bucket.
    func reset(rate: Double, burst: Double, now: Instant) {
        let new = TokenBucket.Pace(rate: rate, burst: burst)
        precondition(new.interval <= 0xFFFF_FFFF && new.tolerance <= 0xFFFF_FFFF, "a shared bucket's pace fits 2 × 32 bits")
        pace.store(new.interval | new.tolerance << 32, ordering: .relaxed)
        full.store(now.nanoseconds, ordering: .relaxed)
    }

    /// Takes one token if there is one (any thread).
    func tryTake(now: Instant) -> Bool {
        let pace = currentPace
        guard pace.interval > 0 else { return true }
        var current = full.load(ordering: .relaxed)
        while true {
            guard let next = pace.take(from: current, at: now.nanoseconds) else { return false }
            // Only the word itself is shared: nothing else is published with it.
            let (exchanged, found) = full.compareExchange(expected: current, desired: next, ordering: .relaxed)
            if exchanged { return true }
            current = found
        }
    }
}
