import CLinuxShims
import SignalingSupport
import Synchronization

/// The routing core shared by all event loops: one `SwitchboardState` behind one lock.
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the lock is released. Work
/// that could grow without bound is split into bounded holds (expiry: a budget per hold;
/// the user index: incremental growth); a message's fan-out to its recipient's devices is
/// still one hold (all-or-nothing, and ordered with the sender's other messages). Every
/// hold is timed: `LoopMetrics.routingLockHold` per loop, `otherThreadHolds` for the rest,
/// `/metrics` sums them (`voipserver_routing_lock_hold_seconds`).
///
/// With a store, the durable changes an operation made are handed to the `StoreWriter`
/// before the lock is released, so commit units reach the writer in the order their
/// sequence numbers were assigned.
final class Switchboard: Sendable {
    private let state: Mutex<SwitchboardState>
    /// Set once, before the loops start (nil without a store).
    nonisolated(unsafe) private(set) var writer: StoreWriter?

    /// The memory held by the state's events (readable without the lock).
    let ledger: MemoryLedger
    /// How long each hold of the lock by a thread that is not an event loop lasted (the
    /// admin API's, the store writer's, start-up's). Recorded before the lock is released,
    /// so the lock is what keeps its writers from overlapping. Loops record theirs in their
    /// own `LoopMetrics.routingLockHold`, after the release.
    let otherThreadHolds = LatencyHistogram.routingLockHold()

    init(configuration: SwitchboardConfiguration, epoch: Instant, journaling: Bool) {
        let initial = SwitchboardState(configuration: configuration, epoch: epoch, journaling: journaling)
        ledger = initial.ledger
        state = Mutex(initial)
    }

    func attach(_ writer: StoreWriter) {
        self.writer = writer
    }

    /// When a caller that queued a commit unit wakes the store writer.
    enum WriterWake {
        /// Before `withState` returns.
        case now
        /// When `loop` has finished its current callback (`EventLoop.owned`): the events
        /// the operation pushes are written first, and the wake-up's system call (and the
        /// writer thread it starts) do not stand between a sender and the devices.
        /// Only for a loop calling from its own thread.
        case afterCallback(of: EventLoop)
    }

    /// Runs `body` with exclusive access to the state. `wall` is the wall-clock time that
    /// events created by the operation are stamped with.
    func withState<Result>(
        wall: UInt64, writerWake: WriterWake = .now, _ body: (inout SwitchboardState) throws -> sending Result
    ) rethrows -> sending Result {
        var wakeWriter = false
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let result = try state.withLock { state in
            hold.start = LoopMetrics.now()
            defer { hold.end = endOfHold(since: hold.start) }
            state.currentWall = wall
            if let writer { state.storeHealthy = writer.isHealthy }
            let result = try body(&state)
            if let unit = state.takeCommitUnit(), let writer { wakeWriter = writer.enqueue(unit) }
            return result
        }
        recordLoopHold(hold)
        // The wake-up is a system call: made after the lock is released.
        if wakeWriter {
            switch writerWake {
            case .now: writer?.wake()
            case .afterCallback(let loop): loop.writerWakePending = true
            }
        }
        return result
    }

    /// Runs a read of the state (and of the device records it links to) under the lock,
    /// without the per-operation bookkeeping of `withState`: nothing it does is journaled.
    func withDevices<Result>(_ body: (borrowing SwitchboardState) throws -> sending Result) rethrows -> sending Result {
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let result = try state.withLock { state in
            hold.start = LoopMetrics.now()
            defer { hold.end = endOfHold(since: hold.start) }
            return try body(state)
        }
        recordLoopHold(hold)
        return result
    }

    // Hold times: one monotonic clock read after the lock is taken and one before it is
    // released (about 20 ns each through the vDSO), so the figure is the hold itself, not
    // the wait for the lock.

    /// Ends a hold measured from `start`, still under the lock: a thread that is not an
    /// event loop records it here, where the lock serialises the writers of
    /// `otherThreadHolds`. Returns the end, or 0 when it was recorded.
    @inline(__always)
    private func endOfHold(since start: UInt64) -> UInt64 {
        let end = LoopMetrics.now()
        guard shim_current_loop() == nil else { return end }
        otherThreadHolds.record(nanoseconds: end &- start)
        return 0
    }

    /// Records a loop thread's hold in its own histogram, after the lock is released.
    @inline(__always)
    private func recordLoopHold(_ hold: (start: UInt64, end: UInt64)) {
        guard hold.end != 0 else { return }
        EventLoop.onCurrentThread { $0.metrics.routingLockHold.record(nanoseconds: hold.end &- hold.start) }
    }

    /// Every hold so far, by every thread: the loops' histograms and `otherThreadHolds`.
    func lockHolds(of loops: [EventLoop]) -> HistogramSnapshot {
        loops.map { $0.metrics.routingLockHold.snapshot() }.reduce(otherThreadHolds.snapshot(), +)
    }

    var counters: SwitchboardCounters { state.withLock { $0.counters } }
}
