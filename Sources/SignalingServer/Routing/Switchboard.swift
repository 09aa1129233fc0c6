import CLinuxShims
import SignalingStore
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
///   lock is held when a shard lock is taken. The store writer's thread follows the same
///   rule: what it does to the routing state (a refusal's cancellation, bodies read back, a
///   release when no loop runs) is one hold per shard, one after the other.
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the lock is released. Work
/// that could grow without bound is split into bounded holds (expiry: a budget per hold;
/// the user index: incremental growth; a fan-out: 128 devices a hold, `FanOut`; an ACK:
/// 128 events a hold, `Acknowledgement`; docs/ARCHITECTURE.md, "Bounded holds"). Every
/// hold is timed: `LoopMetrics.routingLockHold`
/// per loop, `otherThreadHolds` for the rest, `/metrics` sums them
/// (`voipserver_routing_lock_hold_seconds`).
///
/// With a store, the durable changes each hold made are handed to the `StoreWriter`
/// before the shard's lock is released (`CommitUnit`), so a shard's units reach the writer
/// in the order its sequence numbers were assigned, and the writer commits in arrival
/// order. A message that spans two shards is one unit per step plus an answering unit
/// (`runMessage`): the writer commits them in one transaction and sends the OK after it;
/// a refusal cancels the message in every shard it touched (`cancel`). What the writer
/// does to the routing state (a commit's release, a refusal, bodies read back) and the
/// start-up load are one hold per shard concerned, one after the other, like any step.
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

    /// How many shards a server with `workers` loops uses: one per loop, with a store or
    /// without.
    static func shardCount(workers: Int) -> Int {
        max(1, workers)
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
        if wakeWriter, let writer { wake(writer, writerWake) }
        return result
    }

    /// Runs the steps an operation handed on (`ShardStep`), each in a hold of its user's
    /// shard, and those they hand on in turn, until none is left: never two shards at once.
    /// Returns the answer a step gave the request (for one whose first hold did not
    /// answer), and what the loops must do. Steps run in the order they were handed on
    /// (first in, first out), so two steps an operation hands the same shard run in order.
    ///
    /// `group`: with a store, the group the operation's first hold started
    /// (`SwitchboardState.group(for:)`): every step's unit joins it, and it is closed after
    /// the last, so the writer commits them all together.
    func run(
        _ steps: [ShardStep], now: Instant, wall: UInt64, writerWake: WriterWake = .now,
        committedWith group: CommitGroup? = nil
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        let outcome = run(steps, group: group, message: nil, now: now, wall: wall, writerWake: writerWake)
        if let group { close(group, writerWake) }
        return outcome
    }

    /// Runs the steps of a message to another shard's user (`MessageAcceptance.handOff`)
    /// as `run(_:now:wall:writerWake:)` does. With a store, `message` is its deferred OK,
    /// tied already to the sender's first hold (`deferReply(_:answers: false)`): every hold
    /// of the steps ties its commit unit to it too (a fan-out in chunks each of its holds:
    /// `FanOut.committedWith`; a hold that only helps another message's fan-out ties its
    /// unit to that message), and records the message's event it queued; then the
    /// message's answering unit goes to the writer, which commits all of them together
    /// and then answers. Returns the reply to send now: nil when the writer
    /// answers (the message was accepted), else the refusal.
    func runMessage(
        _ handOff: ShardStep, deferring message: DeferredReply?, now: Instant, wall: UInt64,
        writerWake: WriterWake = .now
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        let (decided, effects) = run([handOff], group: message, message: message, now: now, wall: wall, writerWake: writerWake)
        let reply = decided ?? .failure(RequestError(.internalError, "the message was not answered"))
        guard let message, writer != nil else { return (reply, effects) }
        // Refused by a step, which answers: the steps withdrew what they had queued, so the
        // writer commits their units as they are (their sequence reservations too), and
        // must not wait for an answer to them.
        if case .failure = reply { _ = message.settle(.declined) }
        close(message, writerWake)
        if case .failure = reply { return (reply, effects) }
        return (nil, effects)
    }

    /// Hands the writer the unit that closes `group` (after every unit of it).
    private func close(_ group: CommitGroup, _ writerWake: WriterWake) {
        guard let writer else { return }
        if writer.enqueue(CommitUnit(closing: group)) { wake(writer, writerWake) }
    }

    private func run(
        _ steps: [ShardStep], group: CommitGroup?, message: DeferredReply?, now: Instant, wall: UInt64,
        writerWake: WriterWake
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        guard !steps.isEmpty else { return (nil, []) }
        var pending = FIFOQueue<ShardStep>()
        for step in steps { pending.push(step) }
        var reply: Result<UInt64, RequestError>?
        var effects: [SwitchboardEffect] = []
        while let step = pending.pop() {
            let (outcome, stepEffects) = withState(of: step.user, wall: wall, writerWake: writerWake) { board in
                // Tied before the step runs: a fan-out it starts keeps the message for its
                // later holds, and a hold that helps another message's fan-out ties its unit
                // to that message instead (`FanOut.committedWith`).
                let journalsMessage = message != nil && board.journaling
                if let message, journalsMessage { board.deferReply(message, answers: false, queued: nil) }
                let outcome = board.handle(step, now: now)
                if let message, journalsMessage, let queued = outcome.queued {
                    board.recordPart(queued, of: message)
                } else if let group, !journalsMessage {
                    board.join(group)
                }
                return (outcome, board.takeEffects())
            }
            if reply == nil { reply = outcome.reply }
            effects += stepEffects
            for next in outcome.next { pending.push(next) }
        }
        return (reply, effects)
    }

    /// A commit's release (`CommittedRelease`): one hold of each shard it concerns, one
    /// after the other. Returns what the loops must do.
    func apply(_ release: CommittedRelease, wall: UInt64) -> [SwitchboardEffect] {
        release.shards.flatMap { index in withState(shard: index, wall: wall) { release.apply(to: &$0) } }
    }

    /// Cancels messages refused after all (the store timeout, a server that stops while
    /// the store fails) in every shard each touched: its events there, and the sender's id
    /// in the sender's shard. One hold per shard concerned, one after the other.
    func cancel(_ messages: [DeferredReply], wall: UInt64) {
        var byShard: [Int: [(message: DeferredReply, events: [QueuedEvent])]] = [:]
        for message in messages {
            var events: [Int: [QueuedEvent]] = [shard(of: message.sender): []]
            for part in message.parts { events[part.shard, default: []].append(part.event) }
            for (index, shardEvents) in events { byShard[index, default: []].append((message, shardEvents)) }
        }
        for index in byShard.keys.sorted() {
            withState(shard: index, wall: wall) { board in
                for (message, events) in byShard[index]! {
                    board.cancelMessage(events, sender: message.sender, messageID: message.messageID)
                }
            }
        }
    }

    /// Rebuilds what a store kept, one hold per shard, each with its own users' part of
    /// `snapshot`. Called once, before any connection.
    func load(_ snapshot: StoredSnapshot, now: Instant, wall: UInt64, evictsBodies: Bool) {
        var parts = Array(repeating: StoredSnapshot(), count: shards.count)
        for device in snapshot.devices { parts[shard(of: device.userID)].devices.append(device) }
        for (user, events) in snapshot.held { parts[shard(of: user)].held[user] = events }
        for messageID in snapshot.messageIDs { parts[shard(of: messageID.sender)].messageIDs.append(messageID) }
        for (index, part) in parts.enumerated() {
            withState(shard: index, wall: wall) { board in
                board.evictsBodies = evictsBodies
                board.load(part, now: now)
            }
        }
    }

    private func wake(_ writer: StoreWriter, _ writerWake: WriterWake) {
        switch writerWake {
        case .now: writer.wake()
        case .afterCallback(let loop): loop.writerWakePending = true
        }
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
