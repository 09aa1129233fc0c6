import Synchronization

/// The routing core shared by all event loops: one `SwitchboardState` behind one lock.
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the lock is released. With a
/// handful of worker threads the lock is rarely contended; if it ever shows up in a
/// profile, the state can be striped by user id without changing its interface.
final class Switchboard: Sendable {
    private let state: Mutex<SwitchboardState>

    init(configuration: SwitchboardConfiguration) {
        state = Mutex(SwitchboardState(configuration: configuration))
    }

    /// Runs `body` with exclusive access to the state. `wall` is the wall-clock time that
    /// events created by the operation are stamped with.
    func withState<Result>(wall: UInt64, _ body: (inout SwitchboardState) throws -> sending Result) rethrows -> sending Result {
        try state.withLock { state in
            state.currentWall = wall
            return try body(&state)
        }
    }

    var counters: SwitchboardCounters { state.withLock { $0.counters } }
}
