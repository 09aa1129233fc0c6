import CLinuxShims
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The routing core shared by all event loops: the routing state partitioned by user into
/// shards (`ShardMap`), each a `SwitchboardState` behind its own lock.
///
/// Ownership and lock order (docs/ARCHITECTURE.md, "Routing shards"):
/// - A user's devices, queues, held messages, message ids, limits, push registrations and
///   the calls it is called in live in its shard only; a `DeviceRecord`, `QueuedEvent` or
///   `CallRecord` is reachable from one shard and touched only under that shard's lock.
/// - No thread ever holds two shard locks (checked at run time in debug builds:
///   `RoutingShard.holder`). An operation that spans users (a message and
///   its recipient, a receipt and its sender, a call and its caller) is a chain of holds:
///   each hold returns the `ShardStep`s the next shards must run (plain values that name
///   users, never records), and `run(_:)` takes them one hold at a time.
/// - The store writer's `inbox` lock may be taken under a shard lock (`StoreWriter`); no
///   lock is held when a shard lock is taken.
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the lock is released. Work
/// that could grow without bound is split into bounded holds (expiry: a budget per hold;
/// the user index: incremental growth; a fan-out: 128 devices a hold, `FanOut`). Every
/// hold is timed: `LoopMetrics.routingLockHold`
/// per loop, `otherThreadHolds` for the rest, `/metrics` sums them
/// (`voipserver_routing_lock_hold_seconds`).
///
/// With a store, the durable changes an operation made are handed to the `StoreWriter`
/// before the lock is released, so commit units reach the writer in the order their
/// sequence numbers were assigned. The store writer works on one shard (`withState(wall:)`):
/// with a store the switchboard has one shard (`shardCount(workers:journaling:)`).
final class Switchboard: Sendable {
    /// Shard `i` holds the users `ShardMap.shard(of:count:)` maps to `i`.
    private let shards: [RoutingShard]
    /// Set once, before the loops start (nil without a store).
    nonisolated(unsafe) private(set) var writer: StoreWriter?

    /// The memory held by the state's events (readable without the lock), every shard's.
    let ledger: MemoryLedger
    /// How long each hold of a shard lock by a thread that is not an event loop lasted (the
    /// admin API's, the store writer's, start-up's). Recorded before the lock is released;
    /// its own small lock keeps writers of different shards from overlapping. Loops record
    /// theirs in their own `LoopMetrics.routingLockHold`, after the release.
    private let otherThreadHoldsLock = Mutex(())
    let otherThreadHolds = LatencyHistogram.routingLockHold()

    /// How many shards a server with `workers` loops uses: one per loop. With a store, one:
    /// a message's commit unit and its deferred OK would otherwise span two shards' units
    /// (splitting them is the next step of issue 16).
    static func shardCount(workers: Int, journaling: Bool) -> Int {
        journaling ? 1 : max(1, workers)
    }

    init(configuration: SwitchboardConfiguration, epoch: Instant, journaling: Bool, shardCount: Int = 1) {
        let ledger = MemoryLedger()
        self.ledger = ledger
        let callDirectory = CallDirectory()
        shards = (0..<shardCount).map { index in
            RoutingShard(SwitchboardState(
                configuration: configuration, epoch: epoch, journaling: journaling,
                shard: ShardMap(count: shardCount, index: index), ledger: ledger, callDirectory: callDirectory))
        }
    }

    var shardCount: Int { shards.count }

    /// The shard holding `userID`.
    func shard(of userID: String) -> Int { ShardMap.shard(of: userID, count: shards.count) }

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

    /// Runs `body` with exclusive access to the shard holding `userID`. `wall` is the
    /// wall-clock time that events created by the operation are stamped with.
    func withState<Result>(
        of userID: String, wall: UInt64, writerWake: WriterWake = .now,
        _ body: (inout SwitchboardState) throws -> sending Result
    ) rethrows -> sending Result {
        try withState(shard: shard(of: userID), wall: wall, writerWake: writerWake, body)
    }

    /// Runs `body` with exclusive access to the state when there is one shard (the store
    /// writer's and start-up's operations with a store, which span users).
    func withState<Result>(
        wall: UInt64, writerWake: WriterWake = .now, _ body: (inout SwitchboardState) throws -> sending Result
    ) rethrows -> sending Result {
        precondition(shards.count == 1, "an operation across users needs the switchboard to have one shard")
        return try withState(shard: 0, wall: wall, writerWake: writerWake, body)
    }

    /// Runs `body` on every shard in turn, one hold each (configuration changes).
    func forEachShard(wall: UInt64, _ body: (inout SwitchboardState) -> Void) {
        for index in shards.indices { withState(shard: index, wall: wall) { body(&$0) } }
    }

    /// Runs `body` with exclusive access to shard `index`.
    func withState<Result>(
        shard index: Int, wall: UInt64, writerWake: WriterWake = .now,
        _ body: (inout SwitchboardState) throws -> sending Result
    ) rethrows -> sending Result {
        var wakeWriter = false
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let shard = shards[index]
        assertHoldsNoShard()
        let result = try shard.state.withLock { state in
            shard.enterHold()
            defer { shard.leaveHold() }
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

    /// Runs the steps an operation handed on (`ShardStep`), each in a hold of its user's
    /// shard, and those they hand on in turn, until none is left: never two shards at once.
    /// Returns the answer a step gave the request (for one whose first hold did not
    /// answer), and what the loops must do. Steps run in the order they were handed on
    /// (first in, first out), so two steps an operation hands the same shard run in order.
    func run(
        _ steps: [ShardStep], now: Instant, wall: UInt64, writerWake: WriterWake = .now
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        guard !steps.isEmpty else { return (nil, []) }
        var pending = FIFOQueue<ShardStep>()
        for step in steps { pending.push(step) }
        var reply: Result<UInt64, RequestError>?
        var effects: [SwitchboardEffect] = []
        while let step = pending.pop() {
            let (outcome, stepEffects) = withState(of: step.user, wall: wall, writerWake: writerWake) { board in
                (board.handle(step, now: now), board.takeEffects())
            }
            if reply == nil { reply = outcome.reply }
            effects += stepEffects
            for next in outcome.next { pending.push(next) }
        }
        return (reply, effects)
    }

    /// Runs a read of the shard holding `userID` (and of the device records it links to)
    /// under its lock, without the per-operation bookkeeping of `withState`: nothing it
    /// does is journaled.
    func withDevices<Result>(
        of userID: String, _ body: (borrowing SwitchboardState) throws -> sending Result
    ) rethrows -> sending Result {
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let shard = shards[shard(of: userID)]
        assertHoldsNoShard()
        let result = try shard.state.withLock { state in
            shard.enterHold()
            defer { shard.leaveHold() }
            hold.start = LoopMetrics.now()
            defer { hold.end = endOfHold(since: hold.start) }
            return try body(state)
        }
        recordLoopHold(hold)
        return result
    }

    /// Debug builds: the calling thread holds no shard lock (the rule that makes shard
    /// locks deadlock-free and each shard's state its own; costs one load per shard).
    @inline(__always)
    private func assertHoldsNoShard() {
        #if DEBUG
        let thread = RoutingShard.currentThread
        assert(!shards.contains { $0.holder.load(ordering: .relaxed) == thread }, "a thread took a second routing shard's lock")
        #endif
    }

    // Hold times: one monotonic clock read after the lock is taken and one before it is
    // released (about 20 ns each through the vDSO), so the figure is the hold itself, not
    // the wait for the lock.

    /// Ends a hold measured from `start`, still under the lock: a thread that is not an
    /// event loop records it here (`otherThreadHoldsLock` serialises the writers of
    /// `otherThreadHolds`: threads holding different shards). Returns the end, or 0 when
    /// it was recorded.
    @inline(__always)
    private func endOfHold(since start: UInt64) -> UInt64 {
        let end = LoopMetrics.now()
        guard shim_current_loop() == nil else { return end }
        otherThreadHoldsLock.withLock { _ in otherThreadHolds.record(nanoseconds: end &- start) }
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

    /// Every shard's counters added up (one short hold of each).
    var counters: SwitchboardCounters {
        shards.reduce(SwitchboardCounters()) { sum, shard in sum + shard.state.withLock { $0.counters } }
    }
}

/// One shard's state and its lock (a class: `Mutex` cannot be an array element).
final class RoutingShard: Sendable {
    let state: Mutex<SwitchboardState>
    /// Debug builds: the thread holding `state`'s lock (0: none), for the check that no
    /// thread takes two shards (`Switchboard.assertHoldsNoShard`).
    let holder = Atomic<UInt>(0)

    init(_ state: sending SwitchboardState) {
        self.state = Mutex(state)
    }

    static var currentThread: UInt { UInt(pthread_self()) }

    @inline(__always)
    func enterHold() {
        #if DEBUG
        holder.store(Self.currentThread, ordering: .relaxed)
        #endif
    }

    @inline(__always)
    func leaveHold() {
        #if DEBUG
        holder.store(0, ordering: .relaxed)
        #endif
    }
}
