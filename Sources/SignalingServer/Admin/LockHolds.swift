import Synchronization

// Lock of this file (docs/ARCHITECTURE.md, "Locks"): `OffLoopLockHolds.writers`, a leaf
// taken only by threads that are not event loops, after the lock they timed is released.

/// The locks that more than one thread takes on a per-event or per-handshake path, by the
/// name `/metrics` gives them (`voipserver_lock_hold_seconds{lock=...}`). The inventory of
/// every lock, who takes it and in what order, is in docs/ARCHITECTURE.md ("Locks").
enum SharedLock: Int, CaseIterable, Sendable {
    /// A routing shard's fallback lock (`RoutingShard.fallback`), taken only while no loop
    /// runs the shard (start-up, a stopping server, a switchboard without loops): its
    /// owner loop takes no lock. Timed by `Switchboard` itself (`recordHold`), which also
    /// records every hold of a shard, with a lock or without, in
    /// `voipserver_routing_lock_hold_seconds`.
    case routingShard
    /// An `EventLoop`'s `ownership`, held by its own thread for a whole callback.
    case loopOwnership
    /// The overflow of the server's live call ids (`CallDirectory.overflow`): only the
    /// call ids its lock-free table cannot hold (longer than 48 bytes, a full window), not
    /// the per-call path of short ids (no lock).
    case callDirectory
    /// A `LogThrottle` (refused handshakes and requests, a line a second at most).
    case logThrottle
    /// `RelayDirectory.state`, on a cluster's routing node: each relay frame from a front
    /// (the link's thread), each drain, move and release of a relayed connection (loops).
    case relayDirectory
    /// `FrontRelay.route`, on a cluster's front: each loop callback that relays bytes to
    /// the home (its batch is sent under it, so that a `.reset` goes first), the link's
    /// events, the lease thread's poll of the home.
    case frontRoute

    /// The `lock` label.
    var label: String {
        switch self {
        case .routingShard: "routing_shard"
        case .loopOwnership: "loop_ownership"
        case .callDirectory: "call_directory"
        case .logThrottle: "log_throttle"
        case .relayDirectory: "relay_directory"
        case .frontRoute: "front_route"
        }
    }
}

/// One hold-time histogram per `SharedLock` (the routing lock's bounds: 64 ns to 16.8 ms
/// in powers of two), written by one thread only (`LatencyHistogram`'s rule): each loop
/// has its own (`LoopMetrics.lockHolds`), and threads that are not loops share
/// `offLoop`, behind a lock of its own that only they take.
///
/// Cost of a timed hold (`Mutex.withLock(timing:_:)`): two monotonic clock reads under the
/// lock (about 20 ns each through the vDSO with the TSC clock source), then, after the
/// release, one thread-local load and a histogram update (a count-leading-zeros and four
/// relaxed load/store pairs, no read-modify-write). A loop thread shares nothing with
/// another to record.
final class LockHolds: Sendable {
    private let histograms: [LatencyHistogram] = SharedLock.allCases.map { _ in LatencyHistogram.routingLockHold() }

    /// The holds by threads that are not event loops (the store writer, the admin API,
    /// the main thread's reloads, tests), of every server in the process: they are few,
    /// and none of those threads has a place of its own to keep them.
    static let offLoop = OffLoopLockHolds()

    init() {}

    /// Records one hold (single writer: the owning thread).
    @inline(__always)
    func record(_ lock: SharedLock, nanoseconds: UInt64) {
        histograms[lock.rawValue].record(nanoseconds: nanoseconds)
    }

    func histogram(_ lock: SharedLock) -> LatencyHistogram { histograms[lock.rawValue] }

    func snapshot(_ lock: SharedLock) -> HistogramSnapshot { histograms[lock.rawValue].snapshot() }

    /// Records a hold from `start` to `end` (monotonic nanoseconds, `LoopMetrics.now()`)
    /// in the calling thread's histograms: its loop's, else `offLoop`. Call it after the
    /// release, so the recording is not part of the hold.
    @inline(__always)
    static func record(_ lock: SharedLock, from start: UInt64, to end: UInt64) {
        record(lock, nanoseconds: end &- start)
    }

    /// Records a hold of `nanoseconds` as `record(_:from:to:)` does.
    @inline(__always)
    static func record(_ lock: SharedLock, nanoseconds: UInt64) {
        if EventLoop.onCurrentThread({ $0.metrics.lockHolds.record(lock, nanoseconds: nanoseconds) }) == nil {
            offLoop.record(lock, nanoseconds: nanoseconds)
        }
    }

    /// Every hold of `lock` so far: `loops`' histograms and the off-loop ones.
    static func snapshot(_ lock: SharedLock, of loops: [EventLoop]) -> HistogramSnapshot {
        loops.map { $0.metrics.lockHolds.snapshot(lock) }.reduce(offLoop.snapshot(lock), +)
    }
}

/// `LockHolds.offLoop`: the histograms of threads that are not loops, serialised by a lock
/// that no loop ever takes.
final class OffLoopLockHolds: Sendable {
    private let writers = Mutex(())
    private let holds = LockHolds()

    func record(_ lock: SharedLock, nanoseconds: UInt64) {
        writers.withLock { _ in holds.record(lock, nanoseconds: nanoseconds) }
    }

    func snapshot(_ lock: SharedLock) -> HistogramSnapshot { holds.snapshot(lock) }
}

extension Mutex where Value: ~Copyable {
    /// `withLock`, with the hold timed into `lock`'s histogram (see `LockHolds`): from the
    /// moment the lock is taken to just before it is released, so waiting for it is not
    /// included.
    @inline(__always)
    borrowing func withLock<Result>(
        timing lock: SharedLock, _ body: (inout sending Value) -> sending Result
    ) -> sending Result {
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let result = withLock { value -> sending Result in
            hold.start = LoopMetrics.now()
            defer { hold.end = LoopMetrics.now() }
            return body(&value)
        }
        LockHolds.record(lock, from: hold.start, to: hold.end)
        return result
    }
}
