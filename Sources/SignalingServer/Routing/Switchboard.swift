import CLinuxShims
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The routing core shared by all event loops: the routing state partitioned by user into
/// shards (`ShardMap`), each a `SwitchboardState` owned by one loop (`RoutingShard`).
///
/// Ownership and lock order (docs/ARCHITECTURE.md, "Locks" and "Routing shards"):
/// - A user's devices, queues, held messages, message ids, limits, push registrations and
///   the calls it is called in live in its shard only; a `DeviceRecord`, `QueuedEvent` or
///   `CallRecord` is reachable from one shard and touched only by whoever has that shard.
/// - Shard `i` is owned by loop `i` (one shard per loop, `shardCount`). The steps of an
///   operation that spans users (a message and its recipient, a receipt and its sender, a
///   call and its caller) run on the loop that owns their user's shard: each hold returns
///   the `ShardStep`s other shards must run (plain values that name users, never
///   records), and `run` runs those of the calling loop's own shard at once and posts the
///   others to their owners' inboxes (`LoopTask.steps`), which run them and post onward
///   what they hand on. What the store writer does to the routing state per event (a
///   commit's release, a refusal's cancellation, bodies read back) is posted to the
///   owners the same way, one part per shard.
/// - **The rule** (like swift-nio's `NIOLoopBound`): while its owner loop runs (from
///   `claim`, the first thing its thread does in `EventLoop.run`, to `release`, just
///   before its inbox closes: `EventLoop.closeInbox`), a shard is touched by that loop's
///   thread only, with **no lock**. Any other thread that needs it then (the admin API,
///   the push gateway's token removal, a reload, `/metrics`' counters, tests) hands its
///   hold to the owner (`LoopTask.ownerWork`, `OwnerWork`) and waits for it; only threads
///   that are not loops may wait, and loops never wait for them, so nothing deadlocks.
///   Before the server starts a thread, the thread that builds it sets the shards up with
///   no lock (`setUp`: the push routing, the store's snapshot). While no loop runs the
///   shard after that (a loop that has stopped, a `Switchboard` built without owning
///   loops: tests, benchmarks, the embedded loops), every thread takes the shard's **fallback lock**
///   (`RoutingShard.fallback`), the owner too once it let go. The fallback lock also
///   guards the change of owner, so a thread that finds no owner under it cannot meet a
///   claim half-way, and a post its inbox refused (it has just closed) means the owner let
///   go: the poster takes the fallback lock then (`exclusiveElsewhere`). Checked in debug builds:
///   a loop thread touches no shard but its own, except for work a stopped loop can no
///   longer take (`assertOwnedByCaller`), and a loop never waits for another.
/// - No thread is in two shards at once (checked at run time in debug builds:
///   `RoutingShard.holder`), so the fallback locks cannot deadlock, and a hold handed to
///   an owner never waits for a second one.
/// - The `CallDirectory`'s overflow lock may be taken in a hold (only for ids its
///   lock-free table cannot hold: rare); no other lock is taken in a hold, and a fallback
///   lock is taken with no other held. A shard's `published` counters (a leaf held for a
///   copy: by its owner once per tick, by loop 0's `stats` line under the fallback lock)
///   are the one lock taken under it. A loop's inbox, the store writer's and a
///   `DeferredReply`'s parts are no locks (lock-free queues, `MPSCQueue`).
///
/// Every operation is short (dictionary lookups, appends to queues) and does no I/O;
/// sockets are written by each connection's own loop after the hold. Work that could grow
/// without bound is split into bounded holds (expiry: a budget per hold; the user index:
/// incremental growth; a fan-out, and a message's copies to its sender's other devices:
/// 128 devices a hold, `FanOut`; an ACK: 128 events a hold, `Acknowledgement`; each chunk
/// a task of its owner's inbox; docs/ARCHITECTURE.md, "Bounded holds"). Every hold is
/// timed, with a lock or without: `LoopMetrics.routingLockHold` per loop,
/// `otherThreadHolds` for the rest, `/metrics` sums them
/// (`voipserver_routing_lock_hold_seconds`); the holds under a fallback lock are also
/// `routing_shard` in `voipserver_lock_hold_seconds`.
///
/// With a store, the durable changes each hold made are handed to the `StoreWriter`
/// before the hold ends (`CommitUnit`), so a shard's units reach the writer in the order
/// its sequence numbers were assigned, and the writer commits in arrival order. An
/// operation that spans shards is one unit per step plus a closing unit, sent by
/// whichever loop runs its last step (`StepChain`, `finish`): the writer commits them in
/// one transaction and, for a message, sends the OK after it; a refusal cancels the
/// message in every shard it touched (`cancel`).
final class Switchboard: Sendable {
    /// Shard `i` holds the users `ShardMap.shard(of:count:)` maps to `i`.
    private let shards: [RoutingShard]
    /// Set once, before the loops start (nil without a store).
    nonisolated(unsafe) private(set) var writer: StoreWriter?

    /// The memory held by the state's events: each shard's counted in its own ledger, which
    /// publishes to a `MemoryTotal` every 64 KiB it moves. Readable without a hold.
    private let ledgers: [MemoryLedger]
    /// How long each hold of a shard by a thread that is not an event loop lasted (the
    /// admin API's, the store writer's: under the fallback lock, when no loop
    /// runs the shard). Recorded under the fallback lock; its own small lock keeps writers
    /// of different shards from overlapping. Loops record theirs in their own
    /// `LoopMetrics.routingLockHold`.
    private let otherThreadHoldsLock = Mutex(())
    let otherThreadHolds = LatencyHistogram.routingLockHold()
    /// Holds that threads other than a shard's running owner handed to the owner and
    /// waited for (`exclusiveElsewhere`): the admin API's, the push gateway's, reloads', tests'.
    let handedToOwner = Atomic<Int>(0)

    /// Whether other threads may reach the switchboard (`share`): `setUp` stops then.
    private let isShared = Atomic<Bool>(false)

    /// How many shards a server with `workers` loops uses: one per loop, with a store or
    /// without.
    static func shardCount(workers: Int) -> Int {
        max(1, workers)
    }

    /// The loop that owns shard `shard` among `loopCount` event loops: the one place that
    /// says which loop is a user's **home loop** (docs/ARCHITECTURE.md, "Where a
    /// connection lives"). Shard `i` is owned by loop `i` when there are as many shards as
    /// loops, which a server always has (`shardCount(workers:)`); with `--workers 1` the one
    /// loop owns the one shard and nothing ever moves. With any other count (a
    /// `Switchboard` built apart from its loops) no loop owns a shard: nil, and a
    /// connection stays on the loop that accepted it.
    static func ownerLoop(ofShard shard: Int, shardCount: Int, loopCount: Int) -> Int? {
        shardCount == loopCount && (0..<loopCount).contains(shard) ? shard : nil
    }

    /// The home loop of `userID`'s connections (see `ownerLoop(ofShard:shardCount:loopCount:)`).
    func homeLoop(of userID: String, loopCount: Int) -> Int? {
        Self.ownerLoop(ofShard: shard(of: userID), shardCount: shards.count, loopCount: loopCount)
    }

    init(configuration: SwitchboardConfiguration, epoch: Instant, journaling: Bool, shardCount: Int = 1) {
        let total = MemoryTotal()
        let ledgers = (0..<shardCount).map { _ in MemoryLedger(total: total) }
        self.ledgers = ledgers
        let callDirectory = CallDirectory()
        shards = (0..<shardCount).map { index in
            RoutingShard(SwitchboardState(
                configuration: configuration, epoch: epoch, journaling: journaling,
                shard: ShardMap(count: shardCount, index: index), ledger: ledgers[index], shardLedgers: ledgers,
                callDirectory: callDirectory))
        }
    }

    /// The bytes every shard's events hold now, exactly: each shard's ledger read once (for
    /// `/metrics` and the stats line; the memory budget's check reads `MemoryTotal` unless
    /// it is near the budget).
    var eventBytes: Int { ledgers.reduce(0) { $0 + $1.bytes } }

    var shardCount: Int { shards.count }

    /// The shard holding `userID`.
    func shard(of userID: String) -> Int { ShardMap.shard(of: userID, count: shards.count) }

    /// The shard holding `userID`, a user whose device's connection lives on `loop` (the
    /// calling loop): the loop's own when the loops own the shards, since a connection
    /// moves to its user's home loop before its device is registered (EventLoop+HandOver),
    /// so the id is not hashed again for every ACK, request and pump (about 130
    /// instructions for a short id: docs/LOAD-TESTING.md, "Routing on more cores"). Else
    /// hashed (one shard: no hash). Debug builds check it against the hash.
    func shard(of userID: String, connectedOn loop: EventLoop) -> Int {
        guard postsSteps(from: loop) else { return shard(of: userID) }
        assert(shard(of: userID) == Int(loop.index), "a connection of \(userID) on loop \(loop.index), not its home loop")
        return Int(loop.index)
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

    /// Runs `body` with exclusive access to the shard holding `userID`. `wall` is the
    /// wall-clock time that events created by the operation are stamped with.
    func withState<Result>(
        of userID: String, wall: UInt64, writerWake: WriterWake = .now, _ body: (inout SwitchboardState) -> Result
    ) -> Result {
        withState(shard: shard(of: userID), wall: wall, writerWake: writerWake, body)
    }

    /// Runs `body` on every shard's state with no lock and no hold recorded, before the
    /// switchboard is shared (`SignalingServer.init`: the push routing, the store's
    /// snapshot, which may be millions of devices): no other thread can reach it yet, so
    /// the fallback lock would guard nothing, and a start-up load timed as a lock hold
    /// would make `routing_shard` report seconds that no thread waited for. Stops
    /// (`precondition`) once anything shared it: a loop's `claim`, or `share()` when the
    /// server starts its threads. What it wrote reaches those threads with their creation.
    func setUp(wall: UInt64, _ body: (_ shard: Int, inout SwitchboardState) -> Void) {
        precondition(!isShared.load(ordering: .relaxed), "Switchboard.setUp after the switchboard was shared")
        for (index, shard) in shards.enumerated() {
            shard.state.pointee.currentWall = wall
            body(index, &shard.state.pointee)
        }
    }

    /// From now on other threads may reach the switchboard, and `setUp` stops: called by
    /// `SignalingServer.start` before it starts a thread, and by each loop's `claim`.
    func share() {
        isShared.store(true, ordering: .relaxed)
    }

    /// Runs `body` on every shard in turn, one hold each (configuration changes).
    func forEachShard(wall: UInt64, _ body: (inout SwitchboardState) -> Void) {
        for index in shards.indices { withState(shard: index, wall: wall) { body(&$0) } }
    }

    /// Runs `body` with exclusive access to shard `index` (with no lock by
    /// its running owner; handed to the owner by any other thread while it runs; else under
    /// the fallback lock), with the bookkeeping of an operation: the hold's wall time and
    /// store health for `body`, its commit unit to the writer, the hold timed. Always
    /// inlined, as `Mutex.withLock` was: `body` then needs no closure context (an outlined
    /// specialization copied what the closures captured, a message among them: about 90
    /// instructions per event in `routing-bench scaling`).
    @inline(__always)
    func withState<Result>(
        shard index: Int, wall: UInt64, writerWake: WriterWake = .now, _ body: (inout SwitchboardState) -> Result
    ) -> Result {
        let shard = shards[index]
        assertHoldsNoShard()
        assertOwnedByCaller(index)
        var wakeWriter = false
        let result: Result
        // The owner's path, written out: no closure to make, call or retain per event.
        if let owner = shard.callingOwner {
            result = hold(shard, wall: wall, owner: owner, wakeWriter: &wakeWriter, body)
        } else {
            result = withStateElsewhere(shard, index, wall: wall, wakeWriter: &wakeWriter, body)
        }
        // The wake-up is a system call: made after the hold (after the fallback lock is
        // released; by the calling thread for a hold it handed to the owner).
        if wakeWriter, let writer { wake(writer, writerWake) }
        return result
    }

    /// `withState`'s hold by a thread that is not the running owner (`exclusiveElsewhere`),
    /// apart so that the owner's path makes no closure.
    @inline(never)
    private func withStateElsewhere<Result>(
        _ shard: RoutingShard, _ index: Int, wall: UInt64, wakeWriter: inout Bool, _ body: (inout SwitchboardState) -> Result
    ) -> Result {
        exclusiveElsewhere(shard, index) { owner in hold(shard, wall: wall, owner: owner, wakeWriter: &wakeWriter, body) }
    }

    /// One hold of `withState`, by the running owner (`owner`: its loop) or under the
    /// fallback lock (nil).
    @inline(__always)
    private func hold<Result>(
        _ shard: RoutingShard, wall: UInt64, owner: UnsafeMutableRawPointer?, wakeWriter: inout Bool,
        _ body: (inout SwitchboardState) -> Result
    ) -> Result {
        shard.enterHold()
        defer { shard.leaveHold() }
        let start = LoopMetrics.now()
        let state = shard.state
        state.pointee.currentWall = wall
        state.pointee.currentNanos = start
        if let writer { state.pointee.storeHealthy = writer.isHealthy }
        let result = body(&state.pointee)
        if !state.pointee.hasCommitUnit {
            state.pointee.discardCommitUnit()
        } else if let writer {
            wakeWriter = writer.enqueue(state.pointee.takeNonEmptyCommitUnit())
        } else {
            _ = state.pointee.takeNonEmptyCommitUnit()
        }
        recordHold(since: start, owner: owner)
        return result
    }

    /// Runs the steps an operation handed on (`ShardStep`), each in a hold of its user's
    /// shard (consecutive steps of one shard may share one, `drive`), and those they hand
    /// on in turn: never two shards at once.
    ///
    /// Called by a loop (`loop`) while its shards are owned by the loops (`postsSteps`): a
    /// step for the loop's own shard runs at once (a fan-out's next
    /// chunk excepted: it goes to the back of the loop's own inbox, so other work runs
    /// between chunks); a step for another shard is posted to the loop that owns it
    /// (`EventLoop.postStep`), which runs it and the steps it hands on in turn. Called by
    /// any other thread (the admin API), or with one shard: every step runs here.
    ///
    /// Order: steps run first in, first out, and the steps one loop posts to another
    /// arrive in the order they were handed on (one FIFO inbox per loop, each loop's posts
    /// in order): so two steps an operation hands the same shard run in the order they
    /// were handed on, as when one thread ran them all. (Steps of one operation for the
    /// same shard that come from different shards have no order; what relies on one
    /// numbers them: `ShardStep.toCaller`.)
    ///
    /// `chain` says where a step's answer goes and which commit group the steps' units
    /// join; the last step to run closes the group (`finish`). Returns the answer if a
    /// step that ran here decided it (nil: posted, or the store writer answers), and what
    /// the calling loop must do.
    func run(
        _ steps: [ShardStep], chain: StepChain, on loop: EventLoop? = nil, writerWake: WriterWake = .now
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        chain.expect(steps.count)
        guard !steps.isEmpty else { return (finish(chain, writerWake), []) }
        var here = FIFOQueue<PostedStep>()
        for step in steps { route(step, chain: chain, from: loop, into: &here) }
        let ran = drive(&here, on: loop, writerWake: writerWake)
        return (ran.answers.first?.reply, ran.effects)
    }

    /// Runs the steps of a message to another shard's user (`MessageAcceptance.handOff`)
    /// as `run(_:chain:on:writerWake:)` does. With a store, `message` is its deferred OK,
    /// tied already to the sender's first hold (`deferReply(_:answers: false)`): every hold
    /// of the steps ties its commit unit to it too (a fan-out in chunks each of its holds:
    /// `FanOut.committedWith`; a hold that only helps another message's fan-out ties its
    /// unit to that message), and records the message's event it queued; then the
    /// message's answering unit goes to the writer, which commits all of them together
    /// and then answers. Returns the reply to send now: nil when the writer answers (the
    /// message was accepted) or when a step of another loop answers (`requester`), else
    /// the refusal.
    func runMessage(
        _ handOff: ShardStep, deferring message: DeferredReply?, requester: StepChain.Requester? = nil,
        on loop: EventLoop? = nil, now: Instant, wall: UInt64, writerWake: WriterWake = .now
    ) -> (reply: Result<UInt64, RequestError>?, effects: [SwitchboardEffect]) {
        let chain = StepChain(
            now: now, wall: wall, requester: requester, group: nil, message: message, awaitsAnswer: true,
            writerAnswers: writer != nil)
        return run([handOff], chain: chain, on: loop, writerWake: writerWake)
    }

    /// Runs steps other loops posted to `loop` (`LoopTask.steps`), all of them for its own
    /// shard, and those they hand on (`run`). Returns the answers they decided, as tasks
    /// for the requesting connections' loops, and what `loop` must do.
    func runPosted(_ steps: [PostedStep], on loop: EventLoop) -> (replies: [LoopTask], effects: [SwitchboardEffect]) {
        runQueued(steps, on: loop, writerWake: .afterCallback(of: loop))
    }

    /// Runs steps posted to a loop that had stopped (its inbox closed: a server that
    /// stops) on the calling thread, with holds of their shards like any thread that is
    /// not their owner, so that nothing handed on is lost and every request is answered.
    func runOrphaned(_ steps: [PostedStep]) -> (replies: [LoopTask], effects: [SwitchboardEffect]) {
        runQueued(steps, on: nil, writerWake: .now)
    }

    /// Runs steps taken from an inbox in their order (`drive`), with the answers they
    /// decided as tasks for the requesting connections' loops.
    private func runQueued(
        _ steps: [PostedStep], on loop: EventLoop?, writerWake: WriterWake
    ) -> (replies: [LoopTask], effects: [SwitchboardEffect]) {
        var here = FIFOQueue<PostedStep>()
        for step in steps { here.push(step) }
        let ran = drive(&here, on: loop, writerWake: writerWake)
        return (ran.answers.compactMap { $0.chain.requester?.reply($0.reply) }, ran.effects)
    }

    /// Whether `loop`'s shards are owned by the loops, one each (shard `i` by loop `i`):
    /// then steps go to their owners. With one shard there is nothing to hand over.
    @inline(__always)
    func postsSteps(from loop: EventLoop) -> Bool {
        shards.count > 1 && Self.ownerLoop(ofShard: 0, shardCount: shards.count, loopCount: loop.peers.count) != nil
    }

    /// The loop that owns shard `index` among a server's loops (`ownerLoop(ofShard:...)`;
    /// nil: no loops, as for a switchboard without a server).
    func owner(of index: Int, among loops: [EventLoop]) -> EventLoop? {
        Self.ownerLoop(ofShard: index, shardCount: shards.count, loopCount: loops.count).map { loops[$0] }
    }

    /// Queues `step` to run here, or hands it to the loop that owns its shard. The one place
    /// a step's user is hashed to its shard (`PostedStep.shard`), unless the step carries
    /// it (`ShardStep.carriedShard`).
    private func route(_ step: ShardStep, chain: StepChain, from loop: EventLoop?, into here: inout FIFOQueue<PostedStep>) {
        let posted = PostedStep(step: step, chain: chain, shard: step.carriedShard ?? shard(of: step.user))
        guard let loop, postsSteps(from: loop) else { return here.push(posted) }
        // `postsSteps`: every shard has an owner loop.
        let owner = Self.ownerLoop(ofShard: posted.shard, shardCount: shards.count, loopCount: loop.peers.count)!
        if owner == Int(loop.index) {
            // The next chunk of a fan-out or an ACK is a task of its own: what other loops
            // posted meanwhile (and this loop's connections) run between two chunks.
            guard posted.step.isNextChunk else { return here.push(posted) }
        }
        loop.postStep(posted, toLoop: owner)
    }

    /// What running steps decided.
    private struct StepsRan {
        /// Answers to send, with the chain whose requester gets each.
        var answers: [(chain: StepChain, reply: Result<UInt64, RequestError>)] = []
        var effects: [SwitchboardEffect] = []
    }

    /// Runs `here` first in, first out, routing what each step hands on. Consecutive steps
    /// of one shard share a hold (`sharesHold`) until the hold has queued a chunk of events
    /// (`SwitchboardConfiguration.fanOutChunk`; a step always runs whole, and each is a
    /// bounded chunk itself): the steps of one inbox batch (`LoopTask.steps`: everything
    /// another loop handed this shard in one callback) cost one hold (one ownership check),
    /// one pair of clock reads and one effects array, not one per step. The order is the one of a hold
    /// per step: what a step hands on goes behind the steps already queued either way, and
    /// the rest of a batch of receipts (`ShardStep.receipts`) runs before anything else.
    private func drive(_ here: inout FIFOQueue<PostedStep>, on loop: EventLoop?, writerWake: WriterWake) -> StepsRan {
        var ran = StepsRan()
        // What each step of the current hold decided, with its chain (not the step: copying
        // a `ShardStep` out again costs more than the rest of a receipt's bookkeeping).
        var batch: [(chain: StepChain, outcome: StepOutcome)] = []
        // The step the next hold starts with, ahead of `here`: the unfinished rest of the
        // step that ran last (a batch of receipts over a chunk), or the step taken from
        // `here` that could not share the last hold (taken, not peeked: a peek copies it).
        var carried: PostedStep?
        while let first = carried.take() ?? here.pop() {
            var lastHasRest = false
            // The hold's effects go straight into `ran`'s: one array for the whole drive.
            withState(shard: first.shard, wall: first.chain.wall, writerWake: writerWake) { board in
                // Saturating: a benchmark's chunk of `Int.max` (one hold) overflowed the sum.
                let (sum, overflow) = board.counters.eventsQueued.addingReportingOverflow(board.configuration.fanOutChunk)
                let budget = overflow ? Int.max : sum
                var posted = first
                while true {
                    board.currentWall = posted.chain.wall
                    let outcome = run(posted, on: &board, into: &ran.effects)
                    batch.append((posted.chain, outcome))
                    if case .receipts = posted.step, let rest = outcome.next.first, case .receipts = rest {
                        // Over the chunk: the hold ends, the rest comes first in the next
                        // (after it, the steps of receipts whose copies take several holds).
                        carried = PostedStep(step: rest, chain: posted.chain, shard: posted.shard)
                        lastHasRest = true
                        break
                    }
                    guard board.counters.eventsQueued < budget, let next = here.pop() else { break }
                    guard next.shard == first.shard, sharesHold(first, next, journaling: board.journaling) else {
                        carried = next
                        break
                    }
                    posted = next
                }
            }
            for (position, (chain, outcome)) in batch.enumerated() {
                loop?.metrics.stepsRun.add(1)
                if let reply = outcome.reply, let answer = chain.decide(reply) { ran.answers.append((chain, answer)) }
                if lastHasRest && position == batch.count - 1 {
                    // The rest (`carried`) counts as a step of its own.
                    chain.expect(outcome.next.count)
                    for next in outcome.next.dropFirst() { route(next, chain: chain, from: loop, into: &here) }
                } else {
                    chain.expect(outcome.next.count)
                    for next in outcome.next { route(next, chain: chain, from: loop, into: &here) }
                }
                if chain.stepRan(), let answer = finish(chain, writerWake) { ran.answers.append((chain, answer)) }
            }
            batch.removeAll(keepingCapacity: true)
        }
        return ran
    }

    /// Runs one step in the current hold of its shard, with what its chain ties the hold's
    /// commit unit to.
    private func run(
        _ posted: PostedStep, on board: inout SwitchboardState, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        let chain = posted.chain
        // Tied before the step runs: a fan-out it starts keeps the message for its later
        // holds, and a hold that helps another message's fan-out ties its unit to that
        // message instead (`FanOut.committedWith`).
        // The same for a group (an acknowledgement's receipts): a receipt whose copies take
        // several holds ties them to the group (`DeviceBroadcast.group`), and a hold that
        // runs another broadcast's chunk ties its unit to that one's instead.
        let journalsMessage = chain.message != nil && board.journaling
        if let message = chain.message, journalsMessage {
            board.deferReply(message, answers: false, queued: nil)
        } else if let group = chain.group {
            board.join(group)
        }
        let outcome = board.handle(posted.step, now: chain.now, into: &effects)
        if let message = chain.message, journalsMessage, let queued = outcome.queued { board.recordPart(queued, of: message) }
        return outcome
    }

    /// Whether `next` may run in the hold `first` started. Without a store, any step of the
    /// same shard may: a hold's only trace is its effects, in order. With one, a hold is one
    /// commit unit, tied to one group or message: only steps of the same chain that is no
    /// message's (the receipts of one acknowledgement) share it, and never a broadcast's
    /// chunk, which may tie its hold's unit to another broadcast's group (`DeviceBroadcast`).
    private func sharesHold(_ first: PostedStep, _ next: PostedStep, journaling: Bool) -> Bool {
        !journaling
            || (next.chain === first.chain && first.chain.message == nil && !first.step.isBroadcastChunk
                && !next.step.isBroadcastChunk)
    }

    /// The last step of `chain` has run (on whichever loop): an operation that awaited an
    /// answer and got none gets an internal error (returned, to send), and its group is
    /// closed: the writer may commit the units of all its steps (and answer a message).
    private func finish(_ chain: StepChain, _ writerWake: WriterWake) -> Result<UInt64, RequestError>? {
        var answer: Result<UInt64, RequestError>?
        if chain.awaitsAnswer { answer = chain.decide(.failure(RequestError(.internalError, "the request was not answered"))) }
        if let group = chain.group { close(group, writerWake) }
        return answer
    }

    /// Hands the writer the unit that closes `group` (after every unit of it).
    private func close(_ group: CommitGroup, _ writerWake: WriterWake) {
        guard let writer else { return }
        if writer.enqueue(CommitUnit(closing: group)) { wake(writer, writerWake) }
    }

    /// A commit's release (`CommittedRelease`): one hold of each shard it concerns, one
    /// after the other. Returns what the loops must do.
    func apply(_ release: CommittedRelease, wall: UInt64) -> [SwitchboardEffect] {
        release.shards.flatMap { apply(release, shard: $0, wall: wall) }
    }

    /// The part of a commit's release that concerns shard `index` (its owner's, when
    /// shards are owned by loops). Returns what the loops must do.
    func apply(_ release: CommittedRelease, shard index: Int, wall: UInt64, writerWake: WriterWake = .now) -> [SwitchboardEffect] {
        guard release.shards.contains(index) else { return [] }
        return withState(shard: index, wall: wall, writerWake: writerWake) { release.apply(to: &$0) }
    }

    /// Cancels messages refused after all (the store timeout, a server that stops while
    /// the store fails) in every shard each touched: its events there, and the sender's id
    /// in the sender's shard; then sends `answers` (their errors), so that no copy of a
    /// message is written after its sender was told it is refused. One hold per shard
    /// concerned: on the shard's owner loop when the loops own the shards (each part
    /// posted, `LoopTask.cancel`; the loop that runs the last part sends the answers),
    /// else here, one after the other. `messages`: each with the parts its settler took.
    func cancel(_ messages: [(reply: DeferredReply, parts: [DeferredReply.Part])], wall: UInt64, answers: [LoopTask], loops: [EventLoop]) {
        var byShard: [Int: [MessageCancellation.Message]] = [:]
        for (message, parts) in messages {
            var events: [Int: [QueuedEvent]] = [shard(of: message.sender): []]
            for part in parts { events[part.shard, default: []].append(part.event) }
            for (index, shardEvents) in events { byShard[index, default: []].append(.init(reply: message, events: shardEvents)) }
        }
        let remaining = ShardPartsLeft(byShard.count, then: answers)
        for index in byShard.keys.sorted() {
            let part = MessageCancellation(shard: index, messages: byShard[index]!, wall: wall, left: remaining)
            if let owner = owner(of: index, among: loops), owner.post(.cancel(part)) { continue }
            cancel(part, loops: loops)
        }
        if byShard.isEmpty { LoopDispatch.post(answers, to: loops) }
    }

    /// Runs one shard's part of a cancellation (`cancel(_:wall:answers:loops:)`) in a hold
    /// of that shard; the last part sends the answers.
    func cancel(_ part: MessageCancellation, loops: [EventLoop], writerWake: WriterWake = .now) {
        withState(shard: part.shard, wall: part.wall, writerWake: writerWake) { board in
            for message in part.messages {
                board.cancelMessage(message.events, sender: message.reply.sender, messageID: message.reply.messageID)
            }
        }
        if let answers = part.left.partDone() { LoopDispatch.post(answers, to: loops) }
    }

    /// Rebuilds what a store kept, one hold per shard, each with its own users' part of
    /// `snapshot`. Called once, before any connection.
    func load(_ snapshot: StoredSnapshot, now: Instant, wall: UInt64, evictsBodies: Bool) {
        var parts = Array(repeating: StoredSnapshot(), count: shards.count)
        for device in snapshot.devices { parts[shard(of: device.userID)].devices.append(device) }
        for (user, events) in snapshot.held { parts[shard(of: user)].held[user] = events }
        for messageID in snapshot.messageIDs { parts[shard(of: messageID.sender)].messageIDs.append(messageID) }
        setUp(wall: wall) { index, board in
            board.evictsBodies = evictsBodies
            board.load(parts[index], now: now)
            // Loading changes nothing the store does not already hold.
            assert(!board.hasCommitUnit, "the start-up load made store changes")
        }
    }

    private func wake(_ writer: StoreWriter, _ writerWake: WriterWake) {
        switch writerWake {
        case .now: writer.wake()
        case .afterCallback(let loop): loop.writerWakePending = true
        }
    }

    /// Runs a read of the shard holding `userID` (and of the device records it links to)
    /// with exclusive access, as `withState` gives it, without the per-operation
    /// bookkeeping of `withState`: nothing it does is journaled.
    func withDevices<Result>(of userID: String, _ body: (borrowing SwitchboardState) -> Result) -> Result {
        withDevices(shard: shard(of: userID), body)
    }

    /// Runs a read of shard `index` as `withDevices(of:_:)` does (always inlined, as
    /// `withState`).
    @inline(__always)
    func withDevices<Result>(shard index: Int, _ body: (borrowing SwitchboardState) -> Result) -> Result {
        let shard = shards[index]
        assertHoldsNoShard()
        assertOwnedByCaller(index)
        if let owner = shard.callingOwner { return read(shard, owner: owner, body) }
        return withDevicesElsewhere(shard, index, body)
    }

    /// `withDevices`' hold by a thread that is not the running owner, as `withStateElsewhere`.
    @inline(never)
    private func withDevicesElsewhere<Result>(
        _ shard: RoutingShard, _ index: Int, _ body: (borrowing SwitchboardState) -> Result
    ) -> Result {
        exclusiveElsewhere(shard, index) { owner in read(shard, owner: owner, body) }
    }

    /// One hold of `withDevices`, as `hold` is one of `withState`.
    @inline(__always)
    private func read<Result>(
        _ shard: RoutingShard, owner: UnsafeMutableRawPointer?, _ body: (borrowing SwitchboardState) -> Result
    ) -> Result {
        shard.enterHold()
        defer { shard.leaveHold() }
        let start = LoopMetrics.now()
        let result = Self.lend(&shard.state.pointee, to: body)
        recordHold(since: start, owner: owner)
        return result
    }

    /// Hands `body` the state borrowed from `state`, with no copy. Passed straight from the
    /// shard's pointer (`body(shard.state.pointee)`), a borrow became a copy of the whole
    /// state (every array, dictionary and class reference retained, then released): about
    /// 1,700 instructions per message, the pump's two reads (callgrind, issue 16). Through
    /// an `inout`, which no one else may touch meanwhile, the borrow needs none.
    @inline(__always)
    private static func lend<Result>(
        _ state: inout SwitchboardState, to body: (borrowing SwitchboardState) -> Result
    ) -> Result {
        body(state)
    }

    // MARK: Ownership

    /// Runs `work` with exclusive access to `shard`'s state, on the thread the ownership
    /// rule says (top of this file), when the calling thread is not the running owner
    /// (which calls `work` itself, with its loop: `RoutingShard.callingOwner`). Under the
    /// fallback lock, here when no loop runs the shard (`work(nil)`); else (the owner
    /// runs) on the owner's thread, handed to it through its inbox
    /// (`LoopTask.ownerWork`), while this thread waits: the owner then calls `work` with
    /// its loop, or, if it let go meanwhile, with nil under the fallback lock. A post the
    /// owner's inbox refuses (it has just closed) finds the owner gone under the fallback
    /// lock the next time round: an owner lets go of its shard before it closes its inbox
    /// (`release`).
    ///
    /// Only threads that are not loops wait for an owner (the admin API, the push
    /// gateway, reloads, the store writer, tests): loops never wait for them, so they
    /// cannot deadlock. A loop thread that is not the owner touches a shard only when its
    /// owner has stopped (`EventLoop.runsForeignWork`), under the fallback lock.
    @inline(never)
    private func exclusiveElsewhere<Result>(
        _ shard: RoutingShard, _ index: Int, _ work: (_ owner: UnsafeMutableRawPointer?) -> Result
    ) -> Result {
        if let owner = shard.callingOwner { return work(owner) }  // handed here: the owner's thread
        while true {
            var result: Result?
            let owner: EventLoop? = shard.fallback.withLock { owner in
                guard let owner else {
                    result = work(nil)
                    return nil
                }
                return owner
            }
            if let result { return result }
            guard let owner else { continue }  // `work` returned no value (cannot happen)
            // The owner runs: hand it the work and wait for the answer.
            assert(shim_current_loop() == nil, "loop \(EventLoop.onCurrentThread { $0.index } ?? 0) waited for loop \(owner.index), which owns routing shard \(index)")
            var answer: Result?
            // On the owner's thread: with no lock while it runs, under the fallback lock if
            // it let go meanwhile.
            if OwnerWork.run(on: owner, { answer = exclusiveElsewhere(shard, index, work) }), let done = answer {
                handedToOwner.add(1, ordering: .relaxed)
                return done
            }
            // Refused: the owner's inbox has closed, so it let go of the shard first.
        }
    }

    /// Makes `loop` the owner of its shard, which it then touches with no lock, if the
    /// loops own the shards (`ownerLoop(ofShard:shardCount:loopCount:)` among `loop.peers`).
    /// Called by the loop's own thread when it starts running (`EventLoop.run`), after
    /// `shim_set_current_loop`; what other threads did to the shard before is published by
    /// the fallback lock (the start-up's `setUp`, by the creation of the loop's thread).
    func claim(by loop: EventLoop) {
        let index = Int(loop.index)
        guard Self.ownerLoop(ofShard: index, shardCount: shards.count, loopCount: loop.peers.count) == index,
              let address = shim_current_loop(), address == Unmanaged.passUnretained(loop).toOpaque()
        else { return }
        share()
        let shard = shards[index]
        shard.fallback.withLock { owner in
            precondition(owner == nil, "routing shard \(index) has an owner already")
            owner = loop
            shard.ownerAddress.store(UInt(bitPattern: address), ordering: .relaxed)
        }
    }

    /// `loop` lets go of its shard (if it owns it): from now on every thread, the loop
    /// included, takes the fallback lock for it. Called by the loop's own thread before it
    /// closes its inbox (`EventLoop.closeInbox`): a post its inbox refuses then means the
    /// shard is no loop's any more. What it did to the shard with no lock is published by
    /// the lock.
    func release(by loop: EventLoop) {
        let index = Int(loop.index)
        guard index < shards.count, shards[index].isOwnedByCallingThread else { return }
        let shard = shards[index]
        shard.fallback.withLock { owner in
            owner = nil
            shard.ownerAddress.store(0, ordering: .relaxed)
        }
    }

    /// Whether a loop owns shard `index` and runs now (tests).
    func isOwned(shard index: Int) -> Bool {
        shards[index].fallback.withLock { $0 != nil }
    }

    /// Whether `loop` owns a shard now (debug checks).
    func isOwned(by loop: EventLoop) -> Bool {
        let index = Int(loop.index)
        return index < shards.count && shards[index].fallback.withLock { $0 === loop }
    }

    /// Debug builds: the calling thread is in no shard's hold (the rule that makes the
    /// fallback locks deadlock-free, and a hold handed to an owner never wait for another;
    /// costs one load per shard).
    @inline(__always)
    private func assertHoldsNoShard() {
        #if DEBUG
        let thread = RoutingShard.currentThread
        assert(!shards.contains { $0.holder.load(ordering: .relaxed) == thread }, "a thread took a second routing shard")
        #endif
    }

    /// Debug builds: a loop thread touches its own shard only, the rule that makes each
    /// shard its owner loop's (like swift-nio's `NIOLoopBound`): its connections live on
    /// their user's home loop, and steps for other shards go to their owners. The one
    /// exception is work a stopped loop can no longer take (`EventLoop.runsForeignWork`:
    /// steps whose owner's inbox is closed, run by the loop that handed them on, under the
    /// fallback lock). Threads that are not loops (the admin API, the store writer,
    /// start-up) may ask for any shard, one at a time (`exclusiveElsewhere` decides where it runs).
    @inline(__always)
    private func assertOwnedByCaller(_ index: Int) {
        #if DEBUG
        EventLoop.onCurrentThread { loop in
            guard !loop.runsForeignWork, postsSteps(from: loop) else { return }
            assert(index == Int(loop.index), "loop \(loop.index) took routing shard \(index): shard \(index) is loop \(index)'s")
        }
        #endif
    }

    // Hold times: one monotonic clock read when the hold starts (after the fallback lock
    // is taken) and one when it ends (before it is released), about 20 ns each through the
    // vDSO, so the figure is the hold itself, not the wait for the lock or the owner.

    /// Records a hold that started at `start` and ends now: the owner's (`owner`: its loop,
    /// the calling thread's) in its own histogram (no shared atomic); a hold under the
    /// fallback lock, a lock hold, also as `routing_shard` in `LockHolds`: a loop's in its
    /// own histograms, another thread's in `otherThreadHolds` (`otherThreadHoldsLock`
    /// serialises its writers: threads holding different shards' fallback locks).
    @inline(__always)
    private func recordHold(since start: UInt64, owner: UnsafeMutableRawPointer?) {
        let nanoseconds = LoopMetrics.now() &- start
        if let owner {
            Unmanaged<EventLoop>.fromOpaque(owner)._withUnsafeGuaranteedRef {
                $0.metrics.routingLockHold.record(nanoseconds: nanoseconds)
            }
            return
        }
        recordFallbackHold(nanoseconds)
    }

    @inline(never)
    private func recordFallbackHold(_ nanoseconds: UInt64) {
        let recorded: Void? = EventLoop.onCurrentThread { loop in
            loop.metrics.routingLockHold.record(nanoseconds: nanoseconds)
            loop.metrics.lockHolds.record(.routingShard, nanoseconds: nanoseconds)
        }
        guard recorded == nil else { return }
        otherThreadHoldsLock.withLock { _ in otherThreadHolds.record(nanoseconds: nanoseconds) }
        LockHolds.offLoop.record(.routingShard, nanoseconds: nanoseconds)
    }

    /// Every hold so far, by every thread: the loops' histograms and `otherThreadHolds`.
    func lockHolds(of loops: [EventLoop]) -> HistogramSnapshot {
        loops.map { $0.metrics.routingLockHold.snapshot() }.reduce(otherThreadHolds.snapshot(), +)
    }

    /// Every shard's counters added up (one short hold of each: handed to each running
    /// owner in turn). Not on a loop: a loop waits for no other (`countersWithoutWaiting`).
    var counters: SwitchboardCounters {
        shards.indices.reduce(SwitchboardCounters()) { sum, index in sum + withDevices(shard: index) { $0.counters } }
    }

    /// Every shard's counters added up, for a loop (loop 0's `stats` line): its own
    /// shard's as they are, another running owner's as that owner last published them
    /// (`publishCounters`, each tick), a shard no loop runs under its fallback lock.
    var countersWithoutWaiting: SwitchboardCounters {
        shards.reduce(SwitchboardCounters()) { sum, shard in
            if shard.isOwnedByCallingThread { return sum + shard.state.pointee.counters }
            return sum + shard.fallback.withLock { owner in
                owner == nil ? shard.state.pointee.counters : shard.published.withLock { $0 }
            }
        }
    }

    /// Copies the counters of the shard `loop` owns, if it runs it, where other loops may
    /// read them (`countersWithoutWaiting`). Called by the owner at each tick.
    func publishCounters(by loop: EventLoop) {
        let index = Int(loop.index)
        guard index < shards.count, shards[index].isOwnedByCallingThread else { return }
        let shard = shards[index]
        let counters = shard.state.pointee.counters
        shard.published.withLock { $0 = counters }
    }
}

/// One shard's part of cancelling messages the store refused (`Switchboard.cancel`).
struct MessageCancellation: Sendable {
    struct Message: Sendable {
        let reply: DeferredReply
        /// The message's events in this shard (none: only the sender's id is here).
        let events: [QueuedEvent]
    }

    let shard: Int
    let messages: [Message]
    let wall: UInt64
    /// Shared by the parts of one cancellation: the last to run sends the answers.
    let left: ShardPartsLeft
}

/// How many shards' parts of a piece of work are still to run, and what to send once none
/// is left (the answers that must follow all of them). Parts run on different loops in
/// any order, so the count is atomic.
final class ShardPartsLeft: Sendable {
    private let count: Atomic<Int>
    private let then: [LoopTask]

    init(_ parts: Int, then: [LoopTask]) {
        count = Atomic(parts)
        self.then = then
    }

    /// One part has run: what to send now if it was the last, else nil.
    func partDone() -> [LoopTask]? {
        count.wrappingSubtract(1, ordering: .acquiringAndReleasing).newValue == 0 ? then : nil
    }
}

/// One shard's state, the loop that owns it while that loop runs, and the fallback lock
/// for the times no loop does (Switchboard.swift's top comment has the rule).
final class RoutingShard: Sendable {
    /// The state. Touched by its owner loop's thread with no lock while the owner runs
    /// (`ownerAddress` is that loop), else only under `fallback`.
    nonisolated(unsafe) let state: UnsafeMutablePointer<SwitchboardState>
    /// The fallback lock, and the loop that owns the shard now (nil: none). Taken only by
    /// threads that are not the running owner: every thread while no loop runs the shard
    /// (a stopping server, a switchboard without loops), and a thread
    /// that needs the shard while its owner runs, for the moment it takes to find the
    /// owner (it then hands its work to it: `OwnerWork`). The owner takes it twice, to
    /// claim the shard when it starts and to let go of it before its inbox closes.
    let fallback = Mutex<EventLoop?>(nil)
    /// The owner's address (`shim_current_loop` on its thread), 0 when none: what the
    /// owner's per-event check reads (one relaxed load, no lock). Written only by the owner
    /// itself, under `fallback`, so the owner always reads its own last write, and any
    /// other thread that reads it under `fallback` sees whether the owner runs.
    let ownerAddress = Atomic<UInt>(0)
    /// The shard's counters as its running owner last published them (each tick), for
    /// other loops (`Switchboard.countersWithoutWaiting`). A leaf lock held for a copy.
    let published = Mutex(SwitchboardCounters())
    /// Debug builds: the thread inside a hold of this shard (0: none), for the check that no
    /// thread takes two shards (`Switchboard.assertHoldsNoShard`).
    let holder = Atomic<UInt>(0)

    init(_ state: consuming SwitchboardState) {
        self.state = UnsafeMutablePointer.allocate(capacity: 1)
        self.state.initialize(to: state)
    }

    deinit {
        state.deinitialize(count: 1)
        state.deallocate()
    }

    static var currentThread: UInt { UInt(pthread_self()) }

    /// The calling thread's loop if it is the loop that owns the shard and runs (it may
    /// touch the state with no lock), else nil. A thread-local load and a relaxed load.
    @inline(__always)
    var callingOwner: UnsafeMutableRawPointer? {
        let owner = ownerAddress.load(ordering: .relaxed)
        guard owner != 0, let current = shim_current_loop(), UInt(bitPattern: current) == owner else { return nil }
        return current
    }

    /// Whether the calling thread is the loop that owns the shard and runs (`callingOwner`).
    @inline(__always)
    var isOwnedByCallingThread: Bool { callingOwner != nil }

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
