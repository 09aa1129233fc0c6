import SignalingSupport
import Synchronization

/// The routing core shared by all event loops: one `SwitchboardState` behind one lock.
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the lock is released. With a
/// handful of worker threads the lock is rarely contended; if it ever shows up in a
/// profile, the state can be striped by user id without changing its interface.
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
        let result = try state.withLock { state in
            state.currentWall = wall
            if let writer { state.storeHealthy = writer.isHealthy }
            let result = try body(&state)
            if let unit = state.takeCommitUnit(), let writer { wakeWriter = writer.enqueue(unit) }
            return result
        }
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
        try state.withLock { state in try body(state) }
    }

    var counters: SwitchboardCounters { state.withLock { $0.counters } }
}
