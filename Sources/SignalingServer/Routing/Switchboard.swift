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

    init(configuration: SwitchboardConfiguration, epoch: Instant, journaling: Bool) {
        state = Mutex(SwitchboardState(configuration: configuration, epoch: epoch, journaling: journaling))
    }

    func attach(_ writer: StoreWriter) {
        self.writer = writer
    }

    /// Runs `body` with exclusive access to the state. `wall` is the wall-clock time that
    /// events created by the operation are stamped with.
    func withState<Result>(wall: UInt64, _ body: (inout SwitchboardState) throws -> sending Result) rethrows -> sending Result {
        var wakeWriter = false
        let result = try state.withLock { state in
            state.currentWall = wall
            if let writer { state.storeHealthy = writer.isHealthy }
            let result = try body(&state)
            if let unit = state.takeCommitUnit(), let writer { wakeWriter = writer.enqueue(unit) }
            return result
        }
        // The wake-up is a system call: made after the lock is released.
        if wakeWriter { writer?.wake() }
        return result
    }

    var counters: SwitchboardCounters { state.withLock { $0.counters } }
}
