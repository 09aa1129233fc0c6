import CLinuxShims
import SignalingProtocol
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An OK that may only be sent once a message is committed, and what to undo if it
/// cannot be.
struct DeferredReply: Sendable {
    let connection: ConnectionRef
    let requestID: UInt32
    let serverTime: UInt64
    let message: QueuedEvent
    let sender: String
    let messageID: String
    /// After this the sender gets ERROR storeUnavailable instead, and the message is
    /// cancelled everywhere.
    let deadline: Instant
}

/// Group commit: one thread takes every commit unit the loops produced since its last
/// commit and applies them to the store in one transaction, so throughput does not fall to
/// one sync per message. After a commit it makes the events writable (`markDurable`) and
/// sends the deferred OKs; after a failure it retries with back-off, and refuses (and
/// cancels) messages whose deadline passes, so senders get an error instead of an
/// acceptance while the store is full or unwritable.
///
/// Threading: `submit` is called by loops with the switchboard lock held (that keeps units
/// in sequence order); everything else runs on the writer's own thread, which takes the
/// switchboard lock only while holding no lock of its own.
final class StoreWriter: @unchecked Sendable {
    private let store: any EventStore
    private let context: ServerContext
    private let inbox = Mutex<[CommitUnit]>([])
    private let wakeFD: Int32
    private let stopping = Atomic<Bool>(false)
    private let healthy = Atomic<Bool>(true)
    private var thread: JoinableThread?
    /// Loops to deliver effects and replies to (set before `start`).
    var loops: [EventLoop] = []

    // Writer-thread state.
    private var pending: [CommitUnit] = []
    private var failures = 0
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

    init(store: any EventStore, context: ServerContext) throws(ServerError) {
        self.store = store
        self.context = context
        commitInterval = context.configuration.commitInterval
        longestGather = max(commitInterval, min(.milliseconds(250), context.configuration.storeTimeout / 4))
        wakeFD = shim_eventfd()
        guard wakeFD >= 0 else { throw ServerError("cannot create an eventfd for the store writer") }
    }

    deinit { close(wakeFD) }

    /// False while commits fail: new messages and calls are refused at once.
    var isHealthy: Bool { healthy.load(ordering: .relaxed) }

    func start() {
        thread = JoinableThread(name: "vs-store") { self.run() }
    }

    /// Commits what is queued, then stops the thread and closes the store.
    func stop() {
        stopping.store(true, ordering: .releasing)
        shim_eventfd_signal(wakeFD)
        thread?.join()
        store.close()
    }

    /// Queues a unit (called with the switchboard lock held, which keeps units in
    /// sequence order). Returns true when the writer must be woken with `wake()` (the
    /// inbox was empty), which the caller does after releasing its lock.
    func enqueue(_ unit: CommitUnit) -> Bool {
        inbox.withLock { inbox in
            let wasEmpty = inbox.isEmpty
            inbox.append(unit)
            return wasEmpty
        }
    }

    /// Room in a fresh inbox: a 2 ms gathering at a few thousand operations per second.
    private static let inboxCapacity = 16

    func wake() {
        shim_eventfd_signal(wakeFD)
    }

    // MARK: Writer thread

    private func run() {
        let monotonic = SystemClock()
        while true {
            let stop = stopping.load(ordering: .acquiring)
            // Gather for a while (a throttle on real time, not a deadline of the protocol,
            // so it reads the system clock, not the injected one). Loops do not wake the
            // writer meanwhile: the inbox is not empty.
            if !stop, let wokeAt {
                monotonic.sleep(until: wokeAt + max(commitInterval, min(lastCommitDuration, longestGather)))
            }
            // Take the inbox's buffer whole (no copy, and no buffer the size of the last
            // burst kept for ever: a ramp of handshakes can queue thousands of units).
            // The loops get a fresh one with room for a usual gathering, allocated here
            // rather than grown by them, under the routing lock, one append at a time.
            var fresh: [CommitUnit] = []
            fresh.reserveCapacity(Self.inboxCapacity)
            let arrived = inbox.withLock { inbox in
                swap(&fresh, &inbox)
                return fresh
            }
            if pending.isEmpty { pending = arrived } else { pending += arrived }
            if !pending.isEmpty {
                let started = monotonic.now()
                commitPending()
                lastCommitDuration = monotonic.now() - started
            }
            if stop && (pending.isEmpty || failures > 0) {
                if !pending.isEmpty { refuseAll(reason: "the server is stopping and the store cannot commit") }
                return
            }
            // Sleep until new units arrive or the next retry is due.
            var descriptor = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
            let timeout: Int32 = pending.isEmpty ? -1 : retryDelayMilliseconds()
            if poll(&descriptor, 1, timeout) > 0 { shim_eventfd_drain(wakeFD) }
            wokeAt = monotonic.now()
        }
    }

    private func commitPending() {
        var changes: [StoreChange] = []
        changes.reserveCapacity(pending.reduce(0) { $0 + $1.changes.count })
        for unit in pending { changes.append(contentsOf: unit.changes) }
        let collected = changes.count
        StoreBatch.compact(&changes)
        do {
            try store.apply(changes)
        } catch {
            failures += 1
            failedCommits.increment()
            healthy.store(false, ordering: .relaxed)
            StoreHealthLog.log(healthLog.failed(now: context.clock.now()), to: context.logger, error: "\(error)", changes: changes.count)
            refuseExpired()
            return
        }
        StoreHealthLog.log(healthLog.committed(now: context.clock.now()), to: context.logger, error: "", changes: changes.count)
        failures = 0
        healthy.store(true, ordering: .relaxed)
        commits.increment()
        compactedChanges.add(collected - changes.count, ordering: .relaxed)
        let units = pending
        pending = []
        // Units that only record state (acknowledgements, most sessions and events) release
        // nothing: no need to take the routing lock for them.
        if units.contains(where: { !$0.durable.isEmpty || !$0.reservations.isEmpty }) {
            let effects = context.switchboard.withState(wall: context.clock.wallMilliseconds()) { board in
                for unit in units {
                    for (device, through) in unit.reservations { board.confirmReservation(device, through: through) }
                    for (device, seq, kind) in unit.durable { board.markDurable(device, through: seq, kind: kind) }
                }
                return board.takeEffects()
            }
            deliver(effects)
        }
        post(units.compactMap { unit in
            unit.reply.map { .reply($0.connection, .ok(requestID: $0.requestID, serverTime: $0.serverTime)) }
        })
    }

    /// Messages whose deadline passed are refused and cancelled; their changes are not
    /// retried. Everything else stays for the next attempt.
    private func refuseExpired() {
        let now = context.clock.now()
        let expired = pending.filter { $0.reply.map { $0.deadline <= now } ?? false }
        guard !expired.isEmpty else { return }
        pending.removeAll { $0.reply.map { $0.deadline <= now } ?? false }
        refuse(expired, reason: "the store could not commit the message; nothing was accepted, retry later")
        if pending.isEmpty {
            // Nothing left to retry, so nothing would ever notice a recovery: let the next
            // request try the store again (it waits for the store timeout if it still fails).
            failures = 0
            healthy.store(true, ordering: .relaxed)
        }
    }

    private func refuseAll(reason: String) {
        let units = pending.filter { $0.reply != nil }
        pending = []
        refuse(units, reason: reason)
    }

    private func refuse(_ units: [CommitUnit], reason: String) {
        let replies = units.compactMap(\.reply)
        guard !replies.isEmpty else { return }
        context.switchboard.withState(wall: context.clock.wallMilliseconds()) { board in
            for reply in replies { board.cancelMessage(reply.message, sender: reply.sender, messageID: reply.messageID) }
        }
        post(replies.map { .reply($0.connection, .error(requestID: $0.requestID, code: .storeUnavailable, message: reason)) })
    }

    /// 10 ms, doubling to 1 s.
    private func retryDelayMilliseconds() -> Int32 {
        Int32(min(1000, 10 << min(failures, 7)))
    }

    private func deliver(_ effects: [SwitchboardEffect]) {
        var tasks: [LoopTask] = []
        for effect in effects {
            switch effect {
            case .wake(let ref): tasks.append(.wake(ref))
            case .close(let ref, let frame): tasks.append(.close(ref, frame))
            case .wakeUp: context.requestWakeUp(effect)
            }
        }
        post(tasks)
    }

    /// Hands the tasks of one commit to their loops, one batch (one inbox lock, at most
    /// one eventfd write) per loop: posted one at a time, a busy loop would take the first
    /// of a commit's OKs alone and come back for the rest, each time between two requests.
    private func post(_ tasks: [LoopTask]) {
        guard !tasks.isEmpty else { return }
        if loops.count == 1 {
            loops[0].post(contentsOf: tasks)
            return
        }
        var perLoop = [[LoopTask]](repeating: [], count: loops.count)
        for task in tasks {
            let loop: Int
            switch task {
            case .wake(let ref), .close(let ref, _), .reply(let ref, _), .watchWritable(let ref): loop = Int(ref.loop)
            case .drain: loop = 0
            }
            if loop < loops.count { perLoop[loop].append(task) }
        }
        for (loop, tasks) in zip(loops, perLoop) { loop.post(contentsOf: tasks) }
    }
}

extension Int {
    fileprivate var isPowerOfTwo: Bool { self > 0 && self & (self - 1) == 0 }
}
