import CLinuxShims
import SignalingProtocol
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Ownership and locks of this file (docs/ARCHITECTURE.md, "Locks"); the owners are checked
// at run time in debug builds (`StoreWriter.assertOnWriter`, `.assertOnSupervisor`).
//
// - The writer's thread ("vs-store") owns the commit pipeline (`pending`, `bodyRequests`, `sweep`,
//   `failures`, the back-off and gathering state) and is the one consumer of `arrivals`.
// - Loop 0, the supervisor (`loops[0]`), owns the deadline list of the deferred OKs
//   (`deadlines`) and what its ticks saw of the commit under way (`watched`), and is the
//   one consumer of `deadlineArrivals`: it runs `superviseCommits` at every tick, whatever
//   the writer is doing, even waiting for a write that never returns, and
//   `dropSettledReplies` after each of its callbacks.
// - Any thread produces (a loop in a hold of its shard, or in none for a group's
//   closing unit; the admin API; start-up): `enqueue` pushes a commit unit onto
//   `arrivals` and, for a message's answering unit, its `DeferredReply` onto
//   `deadlineArrivals`; `requestBodies` pushes a body request onto `arrivals`. Both are
//   lock-free queues (`MPSCQueue`): a push is one compare-and-exchange, and no producer
//   ever waits for another thread or holds anything another thread waits for. One
//   producer's pushes arrive in its order (so a shard's units, pushed in its holds, one
//   thread at a time: its owner loop's, or under its fallback lock, arrive in sequence
//   order).
// - A `DeferredReply` is answered by whichever thread `settle`s it first (the writer,
//   loop 0's deadline check, a step that declines it): the two owners never need to
//   agree on anything else about it.
//
// Locks: none. The commit under way (`watch`, a `CommitWatch`) is one atomic word that the
// writer sets at each commit's start and end and loop 0 reads at each tick (it replaced the
// `progress` lock, `store_progress`).
// A `DeferredReply`'s parts (`eventsByShard`) are no lock: a lock-free queue pushed to by
// the holds of one message's steps and closed by the thread that settles it (the first
// part, recorded before the reply is shared, is a plain field that only that thread takes). The writer
// holds a shard only with no lock of its own held (under the shard's fallback lock: when
// no loop owns the shard, or its loop stopped).

/// An OK that may only be sent once a message is committed, and what to undo if it
/// cannot be.
///
/// Three threads may answer it: the store writer once the message's commit returned (OK),
/// loop 0's deadline check (`StoreWriter.superviseCommits`) once its deadline passed
/// (ERROR storeUnavailable), whatever the writer is doing, even waiting for a write that
/// never returns, and the loop that runs the step that refuses it (`StepChain.decide`).
/// `settle` lets exactly one of them answer.
final class DeferredReply: CommitGroup, @unchecked Sendable {
    /// Who is waiting for the answer.
    enum Target: Sendable {
        /// A device's MESSAGE_SEND: OK or ERROR on its connection.
        case connection(ConnectionRef, requestID: UInt32)
        /// An admin API request (`POST /v1/messages`): called once, on the thread that
        /// settles (the store writer or loop 0), so it must only hand the result over.
        case completion(@Sendable (Result<UInt64, RequestError>) -> Void)
    }

    let target: Target
    let serverTime: UInt64
    let sender: String
    let messageID: String
    /// After this the sender gets ERROR storeUnavailable instead, and the message is
    /// cancelled everywhere.
    let deadline: Instant
    private let settlement = Atomic<UInt8>(Settlement.open.rawValue)
    /// The message's events, each in the shard that queued it: one for a message within
    /// one shard; the copy for the sender's other devices and the recipient's event for a
    /// message across shards. Pushed by the holds of the message's steps (`add`), all of
    /// them before its answering unit is pushed to the writer (`StoreWriter.enqueue`);
    /// taken, and the queue closed, by the thread that settled it (`takeParts`: a
    /// commit's release, a refusal), after which a push is refused and its step cancels
    /// the event itself. A lock-free queue (`MPSCQueue`), not a lock: the loops of a
    /// message's steps and its settler never wait for each other (the `Mutex` that was here
    /// had holds of up to 68 µs: a holder preempted on a busy host).
    private let eventsByShard = MPSCQueue<Part>()
    /// The part queued by the hold that made the reply (`addFirst`), before any other thread
    /// could see it: most messages have no other part, and a queue node for it cost an
    /// allocation on the loop and a free on the settling thread (callgrind, issue 16).
    /// Written only then, by that hold; read and cleared only by the thread that settled
    /// the reply (`takeParts`), which got the reply through the writer's or loop 0's queue
    /// (an acquiring take of what the hold published with a release).
    private var firstPart: Part?

    /// One of the message's events and the shard holding it.
    struct Part {
        let shard: Int
        let event: QueuedEvent
    }

    enum Settlement: UInt8 {
        /// `accepted`: committed, OK sent. `refused`: ERROR storeUnavailable sent, the
        /// message cancelled; its units are dropped or withdrawn. `declined`: a step of the
        /// message refused it and answered (a full queue, a limit) and undid what the others
        /// queued: its units are committed as they are, with no answer from the writer.
        case open, accepted, refused, declined
    }

    init(
        target: Target, serverTime: UInt64, sender: String, messageID: String, deadline: Instant
    ) {
        self.target = target
        self.serverTime = serverTime
        self.sender = sender
        self.messageID = messageID
        self.deadline = deadline
        super.init()
    }

    /// Records an event the message queued in `shard`. False when the message was settled
    /// and its parts taken already (`takeParts`): the event is not among them, and the
    /// caller must cancel it if the message was refused (`SwitchboardState.recordPart`).
    func add(_ event: QueuedEvent, shard: Int) -> Bool {
        eventsByShard.push(Part(shard: shard, event: event)) != .refused
    }

    /// Records the event queued by the hold that made this reply, before the reply is
    /// shared with any other thread (`SwitchboardState.deferReply(of:_:)`): nothing can
    /// have settled it yet, so it needs neither the queue nor a refusal check.
    func addFirst(_ event: QueuedEvent, shard: Int) {
        precondition(firstPart == nil, "a reply's first part recorded twice")
        firstPart = Part(shard: shard, event: event)
    }

    /// The message's events, taken once by the thread that settled it (later calls take
    /// nothing), for its commit's release or its cancellation: closing the queue, so that a
    /// step that queues an event after this learns it from `add` and cancels it itself.
    /// Taken, not read: the reply stays in loop 0's deadline list until loop 0 next looks
    /// (`dropSettledReplies`), and must not keep memory that the events' queues have let go
    /// of (`MemoryLedger`) alive meanwhile.
    func takeParts() -> [Part] {
        var parts: [Part] = []
        // Only the first call takes the first part (the queue is open until it closes it).
        guard !eventsByShard.isClosed else { return parts }
        if let first = firstPart {
            parts.append(first)
            firstPart = nil
        }
        eventsByShard.close(appendingTo: &parts)
        return parts
    }

    /// Decides the answer, unless it was decided already: true when this call decided it
    /// (the caller then answers the sender), false when the other side did first.
    func settle(_ outcome: Settlement) -> Bool {
        settlement.compareExchange(
            expected: Settlement.open.rawValue, desired: outcome.rawValue, ordering: .acquiringAndReleasing
        ).exchanged
    }

    var isSettled: Bool { settlement.load(ordering: .acquiring) != Settlement.open.rawValue }
    var isRefused: Bool { settlement.load(ordering: .acquiring) == Settlement.refused.rawValue }

    /// The task that answers a device, or nil after calling a completion directly.
    func answer(_ outcome: Result<UInt64, RequestError>) -> LoopTask? {
        switch target {
        case .connection(let connection, let requestID):
            return .reply(connection, Frame.answer(to: requestID, outcome))
        case .completion(let complete):
            complete(outcome)
            return nil
        }
    }
}

/// Bodies the store writer read back for connections whose devices are in one shard
/// (`LoopTask.restoreBodies`).
struct BodiesReadBack: Sendable {
    let shard: Int
    let requests: [(StoreWriter.BodyRequest, [(seq: UInt64, body: [UInt8])])]
}

/// What a commit releases in the routing state, and the OKs that follow it: carried out by
/// the loops (`LoopTask.released`), never by the store writer's thread, which then holds no
/// lock that a push needs. Every step is idempotent and order-insensitive (reservations
/// and durability only move forwards), so two commits released by different loops may
/// land in either order. A release may concern several shards: each shard's part is
/// applied by the loop that owns it, in one hold (`Switchboard.apply(_:shard:wall:)`), and
/// each loop then sends the OKs of its own connections; so an OK follows the release of
/// the shard its connection's loop owns (with connections on their user's home loop, the
/// sender's), not necessarily that of the recipient's shard, which another loop applies
/// meanwhile.
struct CommittedRelease: Sendable {
    let units: [CommitUnit]
    /// The events of committed messages, now durable, each with its shard.
    let messages: [DeferredReply.Part]
    /// The OKs, sent after the release.
    let replies: [LoopTask]
    /// The shards whose state the release changes, ascending (empty: only OKs go out).
    let shards: [Int]

    init(units: [CommitUnit], messages: [DeferredReply.Part], replies: [LoopTask]) {
        self.units = units
        self.messages = messages
        self.replies = replies
        var touched = Set(messages.map(\.shard))
        for unit in units where !unit.durable.isEmpty || !unit.reservations.isEmpty { touched.insert(unit.shard) }
        shards = touched.sorted()
    }

    /// The release changes the routing state (else only the OKs go out).
    var needsRoutingState: Bool { !shards.isEmpty }

    /// Marks the committed events of `board`'s shard writable and its reservations
    /// confirmed; returns the effects (wakes of the devices concerned). Cost: one step per
    /// change of the units.
    func apply(to board: inout SwitchboardState) -> [SwitchboardEffect] {
        var effects: [SwitchboardEffect] = []
        let shard = board.shardMap.index
        // Committed messages that nobody connected is about to receive leave memory.
        for message in messages where message.shard == shard {
            message.event.isDurable = true
            board.evictIfUnwanted(message.event)
        }
        for unit in units where unit.shard == shard {
            for (device, through) in unit.reservations { board.confirmReservation(device, through: through) }
            // A refused message's events stay unwritable (and wake nobody up).
            guard unit.reply?.isRefused != true else { continue }
            for (device, seq, event) in unit.durable { board.markDurable(device, through: seq, about: event, into: &effects) }
        }
        return effects
    }
}

/// Group commit: one thread takes every commit unit the loops produced since its last
/// commit and applies them to the store in one transaction, so throughput does not fall to
/// one sync per message. After a commit it makes the events writable (`markDurable`) and
/// sends the deferred OKs (both through a loop: `CommittedRelease`); after a failure it
/// retries with back-off.
///
/// The store timeout does not depend on this thread, which a write that never returns (a
/// frozen or hung file system) can stop for any time: loop 0 checks the deadlines of the
/// deferred OKs at every tick (`superviseCommits`), refuses (and cancels) the messages
/// whose deadline passed, and declares a commit that runs too long stalled, so that new
/// messages are refused at once and the log says so. A message refused while its commit
/// was under way may still be committed when the write returns: the writer then undoes it
/// in its next commit (`withdrawal(of:)`) instead of sending the OK.
///
/// Shards: the writer is one for all shards, and commits in arrival order (a commit takes
/// every unit that arrived before it). A message to another shard's user leaves one unit
/// per step and then an answering one (a `CommitGroup`, `CommitUnit.answers`); the writer commits them in
/// one transaction (`committable`), and the OK follows that commit, so it is sent only
/// when every change of the message, on every shard, is durable. A refusal (the store
/// timeout, a commit still failing) refuses and cancels the message on every shard it
/// touched, and the writer drops or withdraws all of its units alike.
///
/// Threading (the top of this file says who owns what): `enqueue` is called by loops in a
/// hold of a shard (that keeps each shard's units in sequence order), and outside one
/// for a group's closing unit (by the loop that ran the group's last step);
/// `superviseCommits` by loop 0; everything else runs on the writer's own thread. What it
/// does to the routing state goes to the loops that own the shards concerned, one part
/// per shard (a commit's release, a refusal's cancellation, bodies read back:
/// `LoopTask.released`, `.cancel`, `.restoreBodies`); only when no loop owns a shard (no
/// loops) or its loop has stopped does the writer hold that shard itself (its fallback
/// lock), holding
/// no lock of its own, one shard at a time.
final class StoreWriter: @unchecked Sendable {
    private let store: any EventStore
    private let context: ServerContext
    /// What the loops hand the writer, one element per push.
    private enum Arrival {
        case unit(CommitUnit)
        /// A connection whose next events have their bodies in the store only.
        case bodyRequest(BodyRequest)
    }
    /// A connection's pump stopped at an event whose body is in the store only.
    struct BodyRequest: Sendable {
        let device: DeviceRecord
        let connection: ConnectionRef
        let from: UInt64
    }
    /// Bodies read back per request: about 4 MB of the largest frames, so one request
    /// does not hold the writer for long.
    static let bodiesPerRequest = 64
    /// Commit units and body requests, in the order they were pushed (per producer); the
    /// writer takes them all at once per pass. Any thread pushes, the writer consumes.
    private let arrivals = MPSCQueue<Arrival>()
    /// The deferred OK of each message's answering unit, pushed with it; loop 0 takes them
    /// into `deadlines` after each of its callbacks and at every tick. Any thread pushes,
    /// loop 0 consumes.
    private let deadlineArrivals = MPSCQueue<DeferredReply>()
    /// Loop 0's: every deferred OK not yet seen settled, in deadline order (the store
    /// timeout is constant; deadlines of requests on different loops may be out of order
    /// by the time between reading the clock and pushing the answering unit). Loop 0
    /// refuses the overdue ones and drops the settled ones from the head.
    private var deadlines = FIFOQueue<DeferredReply>()
    /// Loop 0's buffer for taking `deadlineArrivals` (kept, so a take allocates nothing).
    private var arrivedDeadlines: [DeferredReply] = []
    /// The commit under way, if any: written by the writer around `apply`, read by loop 0.
    /// The commit under way: begun and ended by the writer, declared stalled by loop 0.
    private let watch = CommitWatch()
    /// Loop 0's: the commit its previous tick saw running (a commit is declared stalled
    /// only across two ticks, so a test that moves its clock far ahead while an ordinary
    /// commit runs does not see one), the messages refused at their deadline while it ran,
    /// and when `store_stalled` is next repeated.
    private var watched: (number: UInt64, refused: Int, nextWarning: Instant?)?
    /// Passes that took arrivals (the writer counts them; loop 0 reads the count to see
    /// arrivals left untaken across its ticks).
    private let passes = Atomic<UInt64>(0)
    /// Loop 0's: the store's threads' policy (nil: left alone, `--store-thread-priority
    /// normal` or not permitted), the threads it moves, and since which tick arrivals have
    /// waited with no pass taking any (`untaken`).
    private var threadPriority: StoreThreadPriority?
    /// The threads it moves, each with the nice value it had before (what `.normal` restores).
    private var priorityThreads: [(thread: JoinableThread, nice: Int32)] = []
    private var untaken: (passes: UInt64, since: Instant?) = (0, nil)
    /// Whether devices were connecting in a ramp at loop 0's last tick (`ConnectionRamp`),
    /// during which the raised store threads do not step down (`StoreThreadPriority.observe`;
    /// every look at the threads' priority uses it, at a tick or after a callback).
    private var connectionsRamping = false
    /// The store's threads run at the idle policy now (`/metrics`; written by loop 0, or
    /// by the starting thread before the loops run).
    let threadsAtIdlePriority = Atomic<Bool>(false)
    /// How many times loop 0 raised them because the writer fell behind: to nice 19, and to
    /// the normal policy at their own nice value (from either idle or nice 19) (`/metrics`).
    let threadPriorityRaises = Atomic<Int>(0)
    let threadPriorityRaisesToNormal = Atomic<Int>(0)
    private let wakeFD: Int32
    private let stopping = Atomic<Bool>(false)
    private let healthy = Atomic<Bool>(true)
    /// Set once by `fence()`, never cleared: this node lost its store lease.
    private let fenced = Atomic<Bool>(false)
    /// A commit running this long is stalled: half the store timeout, at most 1 s.
    private let stallThreshold: Duration
    /// How often `store_stalled` is repeated while the commit does not return.
    static let stallWarningInterval: Duration = .seconds(5)
    private var thread: JoinableThread?
    /// Debug builds: the writer's thread once it runs (`assertOnWriter`).
    private let writerThread = Atomic<UInt>(0)
    /// Loops to deliver effects and replies to (set before `start`).
    var loops: [EventLoop] = []

    // Writer-thread state.
    private var pending: [CommitUnit] = []
    /// The writer's buffer for taking `arrivals` (kept, so a pass allocates no array).
    private var arrived: [Arrival] = []
    /// Body requests taken with `pending`: served once it is committed (they may concern
    /// events its units journaled).
    private var bodyRequests: [BodyRequest] = []
    private var failures = 0
    /// Message ids that expired while the server was down, forgotten a chunk per pass
    /// while nothing journaled waits (nil once every chunk is committed, or if none expired;
    /// done but not nil: its last chunk is still in `pending`).
    private var sweep: ExpiredMessageIDSweep?
    /// What to log about failures and recoveries (the writer's thread only).
    private var healthLog = StoreHealthLog()
    /// When the writer last woke up to work (monotonic): the next commit starts
    /// `commitInterval` after it.
    private var wokeAt: Instant?
    /// How long the writer gathers units before it commits them. Each commit rewrites
    /// every B-tree page it touches in the WAL, so at a moderate rate (one unit per
    /// commit) the page writes, not the rows, would be the cost. And the commit's burst of
    /// CPU then comes after the push it belongs to, not during it (with
    /// `Delivery.immediate`, events are already on their way when the writer is woken).
    private let commitInterval: Duration
    /// How long the last commit took. Under sustained load the writer gathers at least as
    /// long as that (up to `longestGather`): batches double in size, and more of their
    /// events meet their acknowledgement in the same batch (and never reach the disk), so
    /// the store keeps up with less work per event. A sender's OK then waits about two
    /// commits instead of one.
    private var lastCommitDuration: Duration = .zero
    /// The most the writer gathers for, however long a commit took: one stalled commit
    /// (a slow disk, a huge first batch) must not hold the next one back until messages
    /// run into the store timeout.
    private let longestGather: Duration

    let commits = Atomic<Int>(0)
    let failedCommits = Atomic<Int>(0)
    /// Changes that never reached the store: events acknowledged within their own batch
    /// (`StoreBatch.compacted`).
    let compactedChanges = Atomic<Int>(0)
    /// How long `store.apply` took, committed or failed (real time; this thread writes it).
    let commitLatency = LatencyHistogram()

    /// `expiredMessageIDs`: the snapshot's ids that had expired when it was loaded
    /// (`ExpiredMessageIDSweep`), in the snapshot's order.
    init(store: any EventStore, context: ServerContext, expiredMessageIDs: [StoredMessageID] = []) throws(ServerError) {
        self.store = store
        self.context = context
        if !expiredMessageIDs.isEmpty { sweep = ExpiredMessageIDSweep(expiredMessageIDs) }
        commitInterval = context.configuration.commitInterval
        longestGather = max(commitInterval, min(.milliseconds(250), context.configuration.storeTimeout / 4))
        stallThreshold = min(.seconds(1), context.configuration.storeTimeout / 2)
        wakeFD = shim_eventfd()
        guard wakeFD >= 0 else { throw ServerError("cannot create an eventfd for the store writer") }
    }

    deinit { close(wakeFD) }

    /// False while commits fail or a commit is stalled, and for ever once fenced: new
    /// messages and calls are refused at once.
    var isHealthy: Bool { healthy.load(ordering: .relaxed) && !watch.isStalled && !isFenced }

    /// True once `fence()` was called.
    var isFenced: Bool { fenced.load(ordering: .acquiring) }

    /// The node lost its lease on the store (docs/CLUSTER.md): from now on every new
    /// message and call is refused (storeUnavailable). Commits already queued still go to
    /// the store, which refuses them itself (the Redis store's fencing check), so nothing
    /// this node accepts from here on is acknowledged.
    func fence() {
        fenced.store(true, ordering: .releasing)
    }

    func start() {
        thread = JoinableThread(name: "vs-store") { self.run() }
    }

    /// The writer's thread (once started) and the store's own threads: what thread
    /// placement keeps off the loops' CPUs. Read by the thread that started the writer.
    var threads: [JoinableThread] {
        (thread.map { [$0] } ?? []) + store.backgroundThreads
    }

    /// Puts the writer's and the store's threads at the idle policy, to be raised by loop 0
    /// while the writer falls behind (`StoreThreadPriority`). Called by the thread that
    /// started the writer, before the loops run. Returns nil, or why the threads stay at
    /// the normal policy.
    func lowerThreadPriority() -> String? {
        guard JoinableThread.mayRestoreFromIdle else {
            return "this process may not raise a thread back from the idle policy (needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20)"
        }
        var threads: [(thread: JoinableThread, nice: Int32)] = []
        for thread in self.threads {
            guard case .normal(let nice)? = thread.priority else {
                return "the store's threads' nice values could not be read"
            }
            threads.append((thread, nice))
        }
        for (index, entry) in threads.enumerated() {
            let error = entry.thread.setPriority(.idle)
            guard error == 0 else {
                for moved in threads[..<index] { _ = moved.thread.setPriority(.normal(nice: moved.nice)) }
                return SystemError("pthread_setschedparam", error).reason
            }
        }
        priorityThreads = threads
        threadPriority = StoreThreadPriority(commitInterval: commitInterval)
        threadsAtIdlePriority.store(true, ordering: .relaxed)
        return nil
    }

    /// Loop 0's, at each tick and, while the threads are at idle, after each callback: how
    /// long the writer has kept work waiting, and the threads' policy that follows
    /// (`StoreThreadPriority`). `oldestReply`: the oldest message waiting for its commit.
    private func superviseThreadPriority(now: Instant, oldestReply: DeferredReply?, commit: CommitWatch.Commit?) {
        guard var priority = threadPriority else { return }
        var waited = Duration.zero
        // (`Instant` differences are never negative: the time left, taken from the timeout.)
        if let oldestReply { waited = context.configuration.storeTimeout - (oldestReply.deadline - now) }
        if let commit { waited = max(waited, now - commit.started) }
        // Arrivals that no pass has taken since an earlier look: the writer has not run.
        let passed = passes.load(ordering: .relaxed)
        let waiting = !arrivals.isEmpty
        var unrun = Duration.zero
        if !waiting || passed != untaken.passes {
            untaken = (passed, waiting ? now : nil)
        } else if let since = untaken.since {
            unrun = now - since
            waited = max(waited, unrun)
        } else {
            untaken.since = now
        }
        let action = priority.observe(now: now, waited: waited, unrun: unrun, settingUp: connectionsRamping)
        threadPriority = priority
        guard let action else { return }
        for entry in priorityThreads { _ = entry.thread.setPriority(priority.level.scheduling(own: entry.nice)) }
        threadsAtIdlePriority.store(priority.level == .idle, ordering: .relaxed)
        switch action {
        case .raise(to: .nice19): threadPriorityRaises.add(1, ordering: .relaxed)
        case .raise(to: .normal): threadPriorityRaisesToNormal.add(1, ordering: .relaxed)
        case .raise(to: .idle), .stepDown, .lower: break
        }
        let event = switch action {
        case .raise: "store_threads_raised"
        case .stepDown, .lower: "store_threads_lowered"
        }
        context.logger.debug(event, ["waited_ms": waited.milliseconds, "level": "\(priority.level)"])
    }

    /// Commits what is queued, then stops the thread and closes the store.
    func stop() {
        stopping.store(true, ordering: .releasing)
        shim_eventfd_signal(wakeFD)
        thread?.join()
        store.close()
    }

    /// Queues a unit (called with its shard's lock held, which keeps a shard's units in
    /// sequence order; a message's answering unit after its last step, with no lock), and
    /// an answering unit's deferred OK for loop 0's deadline check. Lock-free: one push
    /// (two for an answering unit). Returns true when the writer must be woken with
    /// `wake()` (the unit went into an empty queue: the writer may be asleep; a later
    /// push finds it non-empty until the writer takes it), which the caller does after
    /// releasing its lock: one eventfd write per batch the writer takes.
    /// Takes the unit and is always inlined, so that the unit is moved into the queue's
    /// node: called, the optimizer made the parameter a borrow again, and the unit was
    /// copied (every array and reference in it retained) and the caller's copy then
    /// destroyed, about 500 instructions per message (callgrind, issue 16).
    @inline(__always)
    func enqueue(_ unit: consuming CommitUnit) -> Bool {
        if let reply = unit.reply, unit.answers { deadlineArrivals.push(reply) }
        return arrivals.push(.unit(unit)) == .queuedFirst
    }

    func wake() {
        shim_eventfd_signal(wakeFD)
    }

    // MARK: Writer thread

    /// The most arrivals whose room the writer keeps between passes: a 2 ms gathering at
    /// tens of thousands of operations per second.
    private static let keptArrivalCapacity = 128

    private func run() {
        #if DEBUG
        writerThread.store(RoutingShard.currentThread, ordering: .relaxed)
        #endif
        let monotonic = SystemClock()
        while true {
            let stop = stopping.load(ordering: .acquiring)
            // Gather for a while (a throttle on real time, not a deadline of the protocol,
            // so it reads the system clock, not the injected one). Loops do not wake the
            // writer meanwhile: what woke it is still queued, so their pushes find the
            // queue non-empty.
            if !stop, let wokeAt {
                monotonic.sleep(until: wokeAt + max(commitInterval, min(lastCommitDuration, longestGather)))
            }
            // Take everything pushed so far, in push order (one exchange).
            if arrivals.takeAll(appendingTo: &arrived) {
                passes.add(1, ordering: .relaxed)
                for arrival in arrived {
                    switch arrival {
                    case .unit(let unit):
                        // An expired id remembered again: its old record goes first (`ExpiredMessageIDSweep`).
                        if let forgets = sweep?.claim(unit), !forgets.isEmpty {
                            var early = CommitUnit()
                            early.changes = forgets
                            pending.append(early)
                        }
                        pending.append(unit)
                    case .bodyRequest(let request): bodyRequests.append(request)
                    }
                }
                // A ramp of handshakes can bring thousands: keep no buffer that size for ever.
                arrived.removeAll(keepingCapacity: arrived.count <= Self.keptArrivalCapacity)
            }
            // The sweep's next chunk, when nothing journaled waits: a message arriving meanwhile
            // waits for one chunk's commit at most.
            if pending.isEmpty && !stop && sweep?.isDone == false {
                var chunk = CommitUnit()
                chunk.changes = sweep?.nextChunk() ?? []
                if !chunk.changes.isEmpty { pending.append(chunk) }
            }
            if !pending.isEmpty {
                let started = monotonic.now()
                commitPending()
                lastCommitDuration = monotonic.now() - started
            }
            if pending.isEmpty, let sweep, sweep.isDone {
                context.logger.info("message_ids_swept", ["forgotten": sweep.forgotten])
                self.sweep = nil
            }
            // Everything journaled before the requests is committed now (or they wait).
            if pending.isEmpty && !bodyRequests.isEmpty { serveBodyRequests() }
            // (A message whose answering unit never came, because the loops are gone, is
            // refused too.)
            if stop && (pending.isEmpty || failures > 0 || Self.committable(pending) == 0) {
                if !pending.isEmpty { refuseAll(reason: "the server is stopping and the store cannot commit") }
                return
            }
            // Sleep until new units arrive or the next retry is due.
            var descriptor = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
            // (With sweep chunks left, no wait: the next pass gathers for a commit interval first.)
            let timeout: Int32 = pending.isEmpty ? (sweep?.isDone == false ? 0 : -1) : retryDelayMilliseconds()
            if poll(&descriptor, 1, timeout) > 0 { shim_eventfd_drain(wakeFD) }
            wokeAt = monotonic.now()
        }
    }

    private func commitPending() {
        assertOnWriter()
        // Messages refused (at their deadline, or by the recipient's shard) before their
        // commit began are not written: none of their units.
        if pending.contains(where: { $0.reply?.isRefused == true }) {
            pending.removeAll { $0.reply?.isRefused == true }
            if pending.isEmpty {
                // Nothing left to retry, so nothing would ever notice a recovery: let the next
                // request try the store again (it waits for the store timeout if it still fails).
                failures = 0
                healthy.store(true, ordering: .relaxed)
                return
            }
        }
        let order = Self.commitOrder(pending)
        guard !order.isEmpty else { return }  // the closing unit is on its way: it wakes the writer
        let units = order.map { pending[$0] }
        var changes: [StoreChange] = []
        changes.reserveCapacity(units.reduce(0) { $0 + $1.changes.count })
        for unit in units { changes.append(contentsOf: unit.changes) }
        let collected = changes.count
        // Nothing durable (answering units of messages whose steps changed nothing that
        // lasts): no write; the answers still follow everything that arrived before them.
        if collected > 0 {
            StoreBatch.compact(&changes)
            let started = context.now()
            watch.begin(at: started, changes: changes.count)
            let applyStarted = LoopMetrics.now()
            do {
                defer { commitLatency.record(nanoseconds: LoopMetrics.now() &- applyStarted) }
                try store.apply(changes)
            } catch {
                failures += 1
                failedCommits.increment()
                healthy.store(false, ordering: .relaxed)
                StoreHealthLog.log(healthLog.failed(now: context.now()), to: context.logger, error: "\(error)", changes: changes.count)
                commitReturned()
                return
            }
            commitReturned()
            StoreHealthLog.log(healthLog.committed(now: context.now()), to: context.logger, error: "", changes: changes.count)
            failures = 0
            healthy.store(true, ordering: .relaxed)
            commits.increment()
            compactedChanges.add(collected - changes.count, ordering: .relaxed)
        }
        if order.count == pending.count {
            pending.removeAll(keepingCapacity: true)
        } else {
            let taken = Set(order)
            pending = pending.indices.filter { !taken.contains($0) }.map { pending[$0] }
        }
        // First every answer (each message's units are all in `units`, its answering one
        // last), then, with every message of the batch decided, the withdrawals.
        var accepted: [LoopTask] = []
        var committedMessages: [DeferredReply.Part] = []
        for unit in units where unit.answers {
            guard let reply = unit.reply, reply.settle(.accepted) else { continue }
            if let task = reply.answer(.success(reply.serverTime)) { accepted.append(task) }
            committedMessages += reply.takeParts()
        }
        // A message refused at its deadline while this commit ran was committed after all:
        // no OK (the sender has its error), no delivery, and the next commit undoes every
        // unit of it, before anything that arrived since (a retry of the same id).
        var withdrawal = CommitUnit()
        var withdrawn = 0
        for unit in units {
            guard let reply = unit.reply, reply.isRefused else { continue }
            withdrawal.changes += Self.withdrawal(of: unit, reply)
            if unit.answers { withdrawn += 1 }
        }
        if !withdrawal.changes.isEmpty {
            pending.insert(withdrawal, at: 0)
            context.logger.warning("store_withdrawing_refused", ["messages": withdrawn])
        }
        let released = CommittedRelease(units: units, messages: committedMessages, replies: accepted)
        // Units that only record state (acknowledgements, most sessions and events) release
        // nothing: no need to hold a shard for them.
        guard released.needsRoutingState else { return post(accepted) }
        // The routing work is the loops', not this thread's: a commit has just spent this
        // thread's share of the CPU, so the scheduler is quick to preempt it, and preempted
        // while it held a shard's fallback lock it would make every push to that shard wait until it
        // ran again. Each shard's owner applies its part, and each loop then sends its
        // OKs: one task per loop concerned, so no extra wake-up for a loop that gets OKs
        // anyway, and each loop's release stays before its OKs.
        let switchboard = context.switchboard
        guard released.shards.allSatisfy({ switchboard.owner(of: $0, among: loops) != nil }) else {
            // Shards not owned by the loops (no loop): nobody else takes the locks.
            deliver(switchboard.apply(released, wall: context.wallMilliseconds()))
            return post(accepted)
        }
        let concerned = Set(released.shards.map { UInt16($0) }).union(accepted.map(\.loop))
        for loop in concerned.sorted() where Int(loop) < loops.count {
            guard !loops[Int(loop)].post(.released(released, loop: loop)) else { continue }
            // That loop has stopped (the server is stopping): its shard's part is done here;
            // its connections, and so their OKs, are gone.
            deliver(switchboard.apply(released, shard: Int(loop), wall: context.wallMilliseconds()))
        }
    }

    /// Which of `pending`'s units the next commit takes (indices, ascending: the commit
    /// keeps their order). A group's units (`CommitGroup`: an operation's steps on several
    /// shards, then its closing unit) go into one transaction, never some without the
    /// others: a crash after a commit that kept a message's event for its recipient but
    /// not the sender's id would deliver the message twice when the sender, who got no OK,
    /// sends it again; one that kept an ACK but not the receipt it sent to another shard
    /// would lose the receipt. And units are committed in arrival order, which for the
    /// units of one shard is the order its sequence numbers were assigned (a durable mark
    /// "through seq" must not be committed before an earlier event of the same device).
    ///
    /// So the commit takes everything before the first unit of the oldest group whose
    /// closing unit has not arrived (the cut: its steps are still running on other
    /// loops). A group that is closed but has units on both sides of the cut (its steps
    /// interleaved with the open group's: a unit of A from shard 0, the first unit of B,
    /// A's unit from shard 1 and A's closing unit) would be split by that cut; its later
    /// units are pulled forward into the commit, past the units that stay, when none of
    /// them touches what a staying unit before it touches (`Footprint`: the same event,
    /// device state of a device the other has events or state of, a message id, a user's
    /// held messages), so no dependent pair changes order. If one cannot be pulled, the
    /// cut moves back to that group's first unit, and so on.
    ///
    /// No deadlock, no starvation: every group closes without the writer (a loop never
    /// waits for a commit to run a step, and a step for a loop that has stopped runs on the
    /// thread that hands it on), so the oldest open group closes within its steps' hops
    /// (an inbox round trip per shard; a fan-out in chunks keeps its group open for all of
    /// its holds, about 160 for 10,000 devices, a few ms), and its closing unit is an
    /// arrival that wakes the writer. A unit that stays waits until the groups open before
    /// it have closed, and, if it belongs to a group that cannot be pulled forward (a
    /// receipt to a device that a newer, still open message also queues to), until the
    /// groups opened before that group's last unit have closed: groups opened later start
    /// after all of its units and cannot hold it back (`ShardedStoreTests`,
    /// "a closed group held back by an open one..."). What has no fixed bound is a chain:
    /// if the group it waits for is itself held back the same way by the next, and so on,
    /// each interleaved with the next on the same device, they all wait as long as the
    /// chain goes on.
    /// Cost: one pass over the units; with groups across the cut, one more per move of the
    /// cut, and the footprints of the units after it.
    static func commitOrder(_ pending: [CommitUnit]) -> [Int] {
        guard pending.contains(where: { $0.group != nil && !$0.closesGroup }) else { return Array(pending.indices) }
        var closed = Set<ObjectIdentifier>()
        for unit in pending where unit.closesGroup {
            if let group = unit.group { closed.insert(ObjectIdentifier(group)) }
        }
        var cut = pending.firstIndex { unit in
            guard let group = unit.group, !unit.closesGroup else { return false }
            return !closed.contains(ObjectIdentifier(group))
        } ?? pending.count
        while cut > 0 {
            var firstIndex: [ObjectIdentifier: Int] = [:]
            for index in 0..<cut {
                if let group = pending[index].group, firstIndex[ObjectIdentifier(group)] == nil {
                    firstIndex[ObjectIdentifier(group)] = index
                }
            }
            let straddling = Set(pending[cut...].compactMap { $0.group.map(ObjectIdentifier.init) }.filter { firstIndex[$0] != nil })
            guard !straddling.isEmpty else { break }
            var staying = Footprint()
            var pulled: [Int] = []
            var blocked: [Int] = []
            for index in cut..<pending.count {
                let unit = pending[index]
                let footprint = Footprint(unit)
                if let group = unit.group.map(ObjectIdentifier.init), straddling.contains(group) {
                    if staying.conflicts(with: footprint) { blocked.append(firstIndex[group]!) } else { pulled.append(index) }
                } else {
                    staying.add(footprint)
                }
            }
            guard let earliest = blocked.min() else { return Array(0..<cut) + pulled }
            cut = earliest
        }
        return Array(0..<cut)
    }

    /// How many units the next commit takes (`commitOrder`).
    static func committable(_ pending: [CommitUnit]) -> Int { commitOrder(pending).count }

    /// What a commit unit touches in the store, for deciding whether two units may be
    /// committed in the other order (`commitOrder`). Appending or withdrawing one event
    /// commutes with any change to another event of the same device (a device's highest
    /// number only grows); device state (its session, acknowledgements, reservations,
    /// push registrations, durable marks "through seq") does not commute with anything of
    /// the same device.
    struct Footprint {
        struct Device: Hashable {
            let user: String
            let device: String
        }
        struct EventKey: Hashable {
            let device: Device
            let seq: UInt64
        }
        var events = Set<EventKey>()
        var eventDevices = Set<Device>()
        var devices = Set<Device>()
        var messageIDs = Set<StoredMessageKey>()
        var heldUsers = Set<String>()

        init() {}

        init(_ unit: CommitUnit) {
            for change in unit.changes {
                switch change {
                case .appendEvent(let user, let device, let stored): addEvent(user, device, stored.seq)
                case .withdrawEvent(let user, let device, let seq): addEvent(user, device, seq)
                case .claimHeldEvent(let user, let device, let seq, _):
                    addEvent(user, device, seq)
                    heldUsers.insert(user)
                case .upsertDevice(let user, let device, _, _), .acknowledge(let user, let device, _),
                    .reserveSequence(let user, let device, _), .removeDevice(let user, let device),
                    .registerPush(let user, let device, _), .removePush(let user, let device, _):
                    devices.insert(Device(user: user, device: device))
                case .holdForUser(let user, _), .releaseHeld(let user, _), .withdrawHeld(let user, _):
                    heldUsers.insert(user)
                case .rememberMessageID(let remembered):
                    messageIDs.insert(StoredMessageKey(sender: remembered.sender, messageID: remembered.messageID))
                case .forgetMessageID(let sender, let messageID, _):
                    messageIDs.insert(StoredMessageKey(sender: sender, messageID: messageID))
                }
            }
            for (device, _, _) in unit.durable { devices.insert(Device(user: device.userID, device: device.deviceID)) }
            for (device, _) in unit.reservations { devices.insert(Device(user: device.userID, device: device.deviceID)) }
        }

        private mutating func addEvent(_ user: String, _ device: String, _ seq: UInt64) {
            let device = Device(user: user, device: device)
            events.insert(EventKey(device: device, seq: seq))
            eventDevices.insert(device)
        }

        mutating func add(_ other: Footprint) {
            events.formUnion(other.events)
            eventDevices.formUnion(other.eventDevices)
            devices.formUnion(other.devices)
            messageIDs.formUnion(other.messageIDs)
            heldUsers.formUnion(other.heldUsers)
        }

        /// Whether the two must keep their order.
        func conflicts(with other: Footprint) -> Bool {
            !events.isDisjoint(with: other.events) || !messageIDs.isDisjoint(with: other.messageIDs)
                || !heldUsers.isDisjoint(with: other.heldUsers)
                || !devices.isDisjoint(with: other.devices) || !devices.isDisjoint(with: other.eventDevices)
                || !eventDevices.isDisjoint(with: other.devices)
        }
    }

    /// What undoes the store changes of a message that was refused but committed: its
    /// events and held events deleted, its id forgotten (the sender may send it again).
    /// Its other changes (sequence reservations, ids evicted to make room) stand.
    private static func withdrawal(of unit: CommitUnit, _ reply: DeferredReply) -> [StoreChange] {
        unit.changes.compactMap { change in
            switch change {
            case .appendEvent(let user, let device, let event):
                return .withdrawEvent(user: user, device: device, seq: event.seq)
            case .holdForUser(let user, let event):
                return .withdrawHeld(user: user, ordinal: event.seq)
            case .rememberMessageID(let remembered) where remembered.sender == reply.sender && remembered.messageID == reply.messageID:
                return .forgetMessageID(sender: remembered.sender, messageID: remembered.messageID, serverTime: remembered.serverTime)
            default:
                return nil
            }
        }
    }

    /// Asks for the bodies of `device`'s events from `from` on, for `connection`'s pump
    /// (any loop thread). Served after everything queued before it is committed.
    func requestBodies(of device: DeviceRecord, for connection: ConnectionRef, from: UInt64) {
        if arrivals.push(.bodyRequest(BodyRequest(device: device, connection: connection, from: from))) == .queuedFirst { wake() }
    }

    /// Reads the requested bodies from the store, puts them back into their events and
    /// tells each connection's loop to pump again.
    private func serveBodyRequests() {
        assertOnWriter()
        guard let source = store as? any EventBodySource else { return }
        let requests = bodyRequests
        bodyRequests = []
        var loaded: [(BodyRequest, [(seq: UInt64, body: [UInt8])])] = []
        for request in requests {
            do {
                let bodies = try source.bodies(
                    user: request.device.userID, device: request.device.deviceID, from: request.from, limit: Self.bodiesPerRequest)
                loaded.append((request, bodies))
            } catch {
                // The pump asks again when it next runs.
                context.logger.error("store_read_failed", ["error": "\(error)", "user": request.device.userID])
            }
        }
        // Requests that failed: their pumps ask again.
        let loadedConnections = Set(loaded.map(\.0.connection))
        post(requests.filter { !loadedConnections.contains($0.connection) }.map { .bodiesLoaded($0.connection) })
        // One hold per shard concerned, by the loop that owns it (else here, one after the
        // other).
        let byShard = Dictionary(grouping: loaded) { request, _ in context.switchboard.shard(of: request.device.userID) }
        for shard in byShard.keys.sorted() {
            let part = BodiesReadBack(shard: shard, requests: byShard[shard]!)
            if let owner = context.switchboard.owner(of: shard, among: loops), owner.post(.restoreBodies(part)) { continue }
            restore(part)
        }
    }

    /// Puts bodies read back into their events (one hold of their shard), then tells each
    /// connection's loop to pump again. Run by the shard's owner loop (`LoopTask.restoreBodies`)
    /// or, without one, by the writer.
    func restore(_ part: BodiesReadBack) {
        let lost = context.switchboard.withState(shard: part.shard, wall: context.wallMilliseconds()) { board in
            part.requests.flatMap { request, bodies in
                board.restoreBodies(bodies, of: request.device, from: request.from).map { (request.device, $0) }
            }
        }
        for (device, seq) in lost {
            context.logger.error("event_body_missing", [
                "user": device.userID, "device": device.deviceID, "seq": seq,
                "detail": "the store has no body for this event; it is skipped",
            ])
        }
        post(part.requests.map { .bodiesLoaded($0.0.connection) })
    }

    /// The commit under way returned (committed or failed): it is no longer stalled.
    private func commitReturned() {
        if let started = watch.end() {
            context.logger.warning("store_stall_ended", ["commit_ms": (context.now() - started).milliseconds])
        }
    }

    private func refuseAll(reason: String) {
        assertOnWriter()
        // Each message once (`settle` decides once), whichever of its units come first.
        let replies = pending.compactMap(\.reply).filter { $0.settle(.refused) }
        pending = []
        refuse(replies, reason: reason)
    }

    /// Cancels the messages (settled as refused by the caller) and then sends their errors.
    private func refuse(_ replies: [DeferredReply], reason: String) {
        guard !replies.isEmpty else { return }
        let answers = replies.compactMap { $0.answer(.failure(RequestError(.storeUnavailable, reason))) }
        context.switchboard.cancel(
            replies.map { ($0, $0.takeParts()) }, wall: context.wallMilliseconds(), answers: answers, loops: loops)
    }

    // MARK: Loop 0

    /// Run by loop 0 at every tick, never by the writer (which may be waiting for a write
    /// that never returns): refuses and cancels the messages whose deadline passed, and
    /// declares a commit that has run for `stallThreshold` stalled: new messages and
    /// calls are then refused at once (`isHealthy`), and `store_stalled` is logged every
    /// `stallWarningInterval` until the commit returns. Costs one take of the deferred OKs
    /// pushed since the last tick and one pass over those settled since then; takes no
    /// lock for them (the deadline list is loop 0's own).
    func superviseCommits(now: Instant, connectionsRamping: Bool) {
        assertOnSupervisor()
        takeDeadlineArrivals()
        var overdue: [DeferredReply] = []
        while let first = deadlines.first, first.isSettled || first.deadline <= now {
            deadlines.pop()
            if first.settle(.refused) { overdue.append(first) }
        }
        refuse(overdue, reason: "the store could not commit the message in time; nothing was accepted, retry later")
        // The writer drops refused units at its next pass, and with nothing else to retry
        // lets the next request try the store again: make that pass now, not after its
        // back-off.
        if !overdue.isEmpty { wake() }

        let underWay = watch.running
        self.connectionsRamping = connectionsRamping
        superviseThreadPriority(now: now, oldestReply: deadlines.first, commit: underWay)
        guard let commit = underWay else {
            watched = nil
            return
        }
        guard var seen = watched, seen.number == commit.number else {
            watched = (commit.number, overdue.count, nil)
            return
        }
        seen.refused += overdue.count
        defer { watched = seen }
        let running = now - commit.started
        guard running >= stallThreshold else { return }
        // Declaring fails when the commit returned since it was read: nothing to say then.
        guard commit.stalled || watch.declareStalled(commit.number) else { return }
        if let next = seen.nextWarning, now < next { return }
        seen.nextWarning = now + Self.stallWarningInterval
        context.logger.warning("store_stalled", [
            "commit_running_ms": running.milliseconds, "changes": commit.changes, "refused": seen.refused,
        ])
    }

    /// Run by loop 0 after each of its callbacks, outside its `ownership`: drops the settled
    /// deferred OKs at the head of the deadline list as their commits land, a few at a
    /// time, rather than all at the next tick (at 100,000 messages/s a 250 ms tick would
    /// free 25,000 at once, a burst of a few ms on a loop). Cost when nothing was settled
    /// or pushed: two atomic loads.
    ///
    /// Also raises the store's threads as soon as work has waited
    /// `StoreThreadPriority.behindAfter` (`now`: the callback's time), rather than at the
    /// next tick: a writer starved at the idle policy would otherwise hold the commits back
    /// for up to a tick (250 ms by default), their release then came as one burst for the
    /// loops, and during a ramp of handshakes the units piled up in memory. Lowering waits
    /// for the ticks. Cost while the threads are at idle: a few more atomic loads.
    func dropSettledReplies(now: Instant) {
        assertOnSupervisor()
        takeDeadlineArrivals()
        while let first = deadlines.first, first.isSettled { deadlines.pop() }
        if let priority = threadPriority, priority.level != .normal {
            superviseThreadPriority(now: now, oldestReply: deadlines.first, commit: watch.running)
        }
    }

    /// Loop 0: moves the deferred OKs pushed since the last take to the deadline list, in
    /// push order.
    private func takeDeadlineArrivals() {
        guard deadlineArrivals.takeAll(appendingTo: &arrivedDeadlines) else { return }
        for reply in arrivedDeadlines { deadlines.push(reply) }
        arrivedDeadlines.removeAll(keepingCapacity: arrivedDeadlines.count <= Self.keptArrivalCapacity)
    }

    // MARK: Ownership checks (debug builds)

    /// Debug builds: the caller is the writer's thread, the owner of the commit pipeline.
    @inline(__always)
    private func assertOnWriter() {
        #if DEBUG
        assert(
            writerThread.load(ordering: .relaxed) == RoutingShard.currentThread,
            "the store writer's commit state was touched off the writer's thread")
        #endif
    }

    /// Debug builds: the caller is loop 0, the owner of the deadline list (like
    /// `Switchboard.assertOwnedByCaller` for the shards).
    @inline(__always)
    private func assertOnSupervisor() {
        #if DEBUG
        assert(
            EventLoop.onCurrentThread { $0 === loops.first } == true,
            "the deferred OKs' deadline list was touched off loop 0, its owner")
        #endif
    }

    /// 10 ms, doubling to 1 s.
    private func retryDelayMilliseconds() -> Int32 {
        Int32(min(1000, 10 << min(failures, 7)))
    }

    private func deliver(_ effects: [SwitchboardEffect]) {
        post(LoopDispatch.tasks(for: effects, context: context))
    }

    private func post(_ tasks: [LoopTask]) {
        LoopDispatch.post(tasks, to: loops)
    }
}
