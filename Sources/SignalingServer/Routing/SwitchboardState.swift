import SignalingProtocol
import SignalingPush
import SignalingStore
import SignalingSupport

/// Tunables of the routing core (a subset of `ServerConfiguration`).
struct SwitchboardConfiguration: Sendable {
    var maxPendingEvents = 10_000
    /// After this long without a connection a device's session is no longer resumable.
    var sessionTTL: Duration = .seconds(86_400)
    /// After this long without a connection a device, and the events nobody collected for
    /// it, are forgotten (as are messages held for a user with no device).
    var eventTTL: Duration = .seconds(30 * 86_400)
    var ringTimeout: Duration = .seconds(60)
    var callGrace: Duration = .seconds(10)
    var dedupWindow: Duration = .seconds(86_400)
    var dedupCapacity = 1_000_000
    /// With a store: whether events go to connected devices before their commit.
    var delivery = Delivery.immediate
    /// Unacknowledged messages one sender may have waiting for one device (or for a user
    /// with no device yet), so that one sender cannot fill a victim's queue for everyone.
    var maxPendingPerSender = 5_000
    /// Messages and calls one user may send per second (bursts of twice as many); 0: no limit.
    var senderRate = 0
    /// Bytes of undelivered events the server may hold before it refuses new messages and
    /// calls (`MemoryLedger`).
    var memoryBudget = Int.max
    /// Devices per hold of a fan-out, of a ring and of a call's ending, held messages per
    /// hold of a claim (`SwitchboardState.fanOutChunk`; a benchmark sets `Int.max` to
    /// measure one in one hold, as it was before chunks).
    var fanOutChunk = SwitchboardState.fanOutChunk
    /// Events per hold of an acknowledgement (`SwitchboardState.ackChunk`; a benchmark
    /// sets `Int.max` to measure an ACK in one hold, as it was before chunks).
    var ackChunk = SwitchboardState.ackChunk
}

/// Something the event loops must do after the switchboard changed state. Operations
/// append them to the array their caller passes (`into effects:`), which the caller carries
/// out after the hold (`EventLoop.apply`, `LoopDispatch`).
enum SwitchboardEffect: Equatable, Sendable {
    /// New events are ready for the device behind this connection: write them.
    case wake(ConnectionRef)
    /// Close this connection with this CLOSE frame (another connection took over).
    case close(ConnectionRef, Close)
    /// An event is ready for a device with no live connection that registered for push.
    case wakeUp(WakeUp)
}

/// What a successful handshake produced.
struct AttachGrant {
    let record: DeviceRecord
    let sessionID: SessionID
    let resumed: Bool
    let ackedSeq: UInt64
    /// Where the new connection starts writing: events after this are sent.
    let sentSeq: UInt64
    /// The highest sequence number ever assigned to the device.
    let lastSeq: UInt64
    /// Events are waiting: the loop must pump the connection after WELCOME.
    let needsPump: Bool
    /// Receipts of what the resume point acknowledged, for senders on other shards.
    let next: [ShardStep]
    /// The rest of the device's claim of the messages held for its user, for this shard
    /// (nil: nothing more to claim). Run on its own, not with `next`: each chunk's changes
    /// are committed on their own (`HeldClaim`).
    var claim: ShardStep? = nil
}

/// Operations whose commit units the store writer commits in one transaction: the holds
/// of a chain of steps across shards (a message and its steps, an ACK and the receipts it
/// sends to senders on other shards). Each hold's unit joins the group
/// (`CommitUnit.closesGroup` false); the thread that ran the chain then closes it with a
/// unit of no changes. A plain identity (a message's `DeferredReply` is one).
class CommitGroup: @unchecked Sendable {
    init() {}
}

/// Durable changes made by one hold of one shard, and the events they make writable once
/// the store has committed them.
///
/// A unit reaches the store writer before its shard's lock is released, so a shard's units
/// arrive in the order its sequence numbers were assigned; the writer commits in arrival
/// order (a commit takes everything that arrived before it). The units of an operation
/// that spans shards form a `CommitGroup`: one unit per step, then a closing unit with no
/// changes; the writer commits them in one transaction, never some without the others
/// (`StoreWriter.committable`). A message's closing unit answers it (`reply`).
struct CommitUnit: Sendable {
    /// The shard whose hold made it (its `durable` and `reservations` are that shard's).
    var shard = 0
    var changes: [StoreChange] = []
    /// (device, seq): after the commit, events of `device` up to `seq` may be written.
    /// `event` is the last of them, what an offline device's wake-up is about.
    var durable: [(device: DeviceRecord, seq: UInt64, event: QueuedEvent)] = []
    /// (device, through): after the commit, numbers of `device` up to `through` are
    /// reserved (`DeviceRecord.reservedAhead`).
    var reservations: [(device: DeviceRecord, through: UInt64)] = []
    /// The MESSAGE_SEND whose changes these are (nil: no message's); its group.
    var reply: DeferredReply?
    /// The group the unit belongs to (nil: none, committed on its own).
    var group: CommitGroup?
    /// The unit is the last of its group: for a message, its OK is sent once this unit is
    /// committed (false: an earlier step's, committed with the closing unit, refused with it).
    var closesGroup = true
    /// Whether the unit answers a message (its OK follows the unit's commit).
    var answers: Bool { reply != nil && closesGroup }
    var isEmpty: Bool { changes.isEmpty && (reply == nil || !closesGroup) }

    init() {}

    /// The closing unit of `group` (with no changes); a message's answers it.
    init(closing group: CommitGroup) {
        self.group = group
        reply = group as? DeferredReply
    }

    /// Adds a change. A unit starts with room for the changes its first one comes with,
    /// since growing the array one element at a time would allocate for each: a message
    /// takes two or three (its event, its id, now and then a reservation), a registration
    /// two (the device, its first reservation), an acknowledgement one or two (the
    /// receipt's event when the sender's device is in the same shard). A `StoreChange` is
    /// 120 bytes: room for four is a 512-byte allocation, for two 272, for one 152. During
    /// a handshake ramp the store's threads, at idle priority, may not run for 50 ms while
    /// thousands of registrations wait in their queue, and the memory their units took
    /// stays with the process after they are freed (issue 16).
    mutating func add(_ change: StoreChange) {
        if changes.capacity == 0 { changes.reserveCapacity(change.unitRoom) }
        changes.append(change)
    }
}

extension StoreChange {
    /// How many changes the hold that journals this one first usually journals in all.
    fileprivate var unitRoom: Int {
        switch self {
        case .appendEvent, .holdForUser, .claimHeldEvent, .rememberMessageID: 4
        case .upsertDevice, .acknowledge: 2
        default: 1
        }
    }
}

/// Counters exported as server statistics.
struct SwitchboardCounters: Sendable, Equatable {
    var eventsQueued = 0
    /// Call events and receipts that found a full queue (messages are refused instead).
    var eventsDropped = 0
    var sessionsExpired = 0
    var devicesExpired = 0
    /// Unacknowledged events thrown away with an expired device or held for too long.
    var eventsExpired = 0
    var messagesAccepted = 0
    var messagesDeduplicated = 0
    /// Messages refused after all because the store could not commit them in time.
    var messagesCancelled = 0
    var callsStarted = 0
    /// Messages and calls refused by the per-sender limits and the memory budget.
    var refusedSenderQuota = 0
    var refusedRate = 0
    var refusedCapacity = 0
    /// Message bodies dropped from memory (the store keeps them) and read back.
    var bodiesEvicted = 0
    var bodiesRestored = 0
    /// Events waiting in device queues or held for users (a fanned-out event counts once
    /// per queue).
    var pendingEvents = 0
}

extension SwitchboardCounters {
    /// The server's counters: every shard's added up.
    static func + (a: Self, b: Self) -> Self {
        var sum = a
        sum.eventsQueued += b.eventsQueued
        sum.eventsDropped += b.eventsDropped
        sum.sessionsExpired += b.sessionsExpired
        sum.devicesExpired += b.devicesExpired
        sum.eventsExpired += b.eventsExpired
        sum.messagesAccepted += b.messagesAccepted
        sum.messagesDeduplicated += b.messagesDeduplicated
        sum.messagesCancelled += b.messagesCancelled
        sum.callsStarted += b.callsStarted
        sum.refusedSenderQuota += b.refusedSenderQuota
        sum.refusedRate += b.refusedRate
        sum.refusedCapacity += b.refusedCapacity
        sum.bodiesEvicted += b.bodiesEvicted
        sum.bodiesRestored += b.bodiesRestored
        sum.pendingEvents += b.pendingEvents
        return sum
    }
}

/// The routing core: users, devices, sessions, queues and calls, as a pure state machine.
///
/// Every operation takes the current time as an argument and appends what the event loops
/// must do to the caller's `effects` (its `into:` argument, in the order decided), and,
/// when a store is attached, records what must be made durable (`takeCommitUnit()`).
/// The effects are the caller's from the start: no operation leaves any behind in the
/// state for the next hold to find (as a buffer kept here and emptied by a `takeEffects()`
/// did, when a caller forgot to take them), and a caller with no connections to wake (a
/// benchmark, a test) drops them visibly. Nothing here does I/O or reads a clock.
/// The server keeps one instance behind the `Switchboard` lock; tests drive it directly.
///
/// With a store (`journaling`), an event is written to a connected device at once
/// (`Delivery.immediate`, while the store is healthy) or once the change that created it
/// is committed (`markDurable`); to an offline device's wake-up only after the commit.
/// Without a store, at once.
struct SwitchboardState {
    /// `maxPendingEvents` may change at run time (a SIGHUP reload, under the lock).
    var configuration: SwitchboardConfiguration
    /// Time zero of the 32-bit second timeline used in device records.
    let epoch: Instant
    let journaling: Bool

    /// The head of each user's device list.
    var users = UserIndex()
    /// Calls, held messages and recent message ids, for the users that have any.
    var activities = IncrementalDictionary<String, UserActivity>()
    var calls = IncrementalDictionary<String, CallRecord>()
    /// Fan-outs in chunks (`FanOut`) by id, from their start until the step that started
    /// each takes its answer; `nextFanOutID` numbers them.
    var fanOuts: [UInt64: FanOut] = [:]
    var nextFanOutID: UInt64 = 0
    /// Numbers claims of held messages (`HeldClaim.id`).
    var nextClaimID: UInt64 = 0
    /// Events being queued to many devices of a user in chunks (`DeviceBroadcast`) by id,
    /// from their start until their last chunk; `nextBroadcastID` numbers them.
    var broadcasts: [UInt64: DeviceBroadcast] = [:]
    var nextBroadcastID: UInt64 = 0
    /// Acknowledgements taking their events out in chunks (`Acknowledgement`), from the
    /// hold that received each until its last chunk.
    var acknowledgements = Acknowledgements()
    /// Each device's push registrations (at most one per kind, a handful of bytes each);
    /// a device with none has no entry.
    var pushRegistrations = IncrementalDictionary<ObjectIdentifier, [PushRegistration]>()
    var counters = SwitchboardCounters()
    /// The memory held by this shard's events, exactly (`--memory-budget`, with the other
    /// shards' as they published it: `heldBytes`).
    let ledger: MemoryLedger
    /// Every shard's ledger (this one's included), read only near the memory budget.
    let shardLedgers: [MemoryLedger]
    /// Which shard this is: the users it holds (`ShardMap.owns`).
    let shardMap: ShardMap
    /// The live call ids of every shard (shared by the shards).
    let callDirectory: CallDirectory
    /// Unacknowledged messages per sender and recipient queue (`maxPendingPerSender`);
    /// an entry exists only while its count is positive.
    var pendingBySender = IncrementalDictionary<SenderShareKey, Int>()
    /// The queues whose shares are counted (see `shareFloor`).
    var trackedShareQueues: Set<ShareQueue> = []
    /// The push services configured (nil: none; offline devices are never woken).
    var pushRouting: PushRouting?
    /// False while the store fails to commit (set by `Switchboard.withState`): events then
    /// wait for their commit even with `Delivery.immediate`, so that a message refused
    /// with storeUnavailable was not delivered first.
    var storeHealthy = true
    /// The store hands back stored bodies (`EventBodySource`): committed messages that no
    /// connected device is about to receive keep only their metadata in memory.
    var evictsBodies = false
    /// Wall-clock time of the operation in progress (set by `Switchboard.withState`).
    var currentWall: UInt64 = 0
    /// When the hold in progress started (`LoopMetrics.now()`, set by `Switchboard`'s hold;
    /// 0 outside one): the creation stamp of the events it makes, for the push latency
    /// histogram. The hold reads the clock anyway (its own timing); a read per event was
    /// 2 % of `routing-bench scaling`'s time (a fan-out's receipts, `perf record`).
    var currentNanos: UInt64 = 0
    /// Session ids come from here (no system call per handshake).
    private var random = FastRandom()

    private var unit = CommitUnit()

    // Deadlines. Each FIFO's kind has a constant length, so the FIFO is in deadline order.
    // A deadline never fires early: exact instants for the short ones; the expiries kept in
    // seconds (device records have room for no more) fire one second after
    // `disconnectedSecond + TTL`, because `second(_:)` rounds the disconnect down.
    //
    // Session and device expiry: at most one entry per device in each heap (the device's
    // `expiryEntries` says which), re-armed lazily: a device that reconnects keeps its
    // entry, and when the entry comes due the real deadline is worked out from the
    // device's latest disconnect. One entry per device per heap, however often it
    // reconnects (a FIFO entry per disconnect grew the server by ~50 bytes per
    // connect for a day: see docs/ARCHITECTURE.md, "Timers").
    private var sessionExpiry = DeadlineHeap<UInt32, DeviceRecord, Void>()
    private var deviceExpiry = DeadlineHeap<UInt32, DeviceRecord, Void>()
    private var ringExpiry = FIFOQueue<(call: CallRecord, deadline: Instant)>()
    /// A call party lost its connection: the call ends at `deadline` unless the party is
    /// back, or lost it again later (`CallRecord.graceDeadline(of:)` is then another one).
    private var graceChecks = FIFOQueue<(call: CallRecord, device: DeviceRecord, deadline: Instant)>()
    /// The same for a calling device, in the caller's shard (`OutgoingCall.graceDeadline`).
    private var callerGraceChecks = FIFOQueue<(call: OutgoingCall, deadline: Instant)>()
    private var dedupExpiry = FIFOQueue<(sender: String, messageID: String, deadline: Instant)>()
    private var heldExpiry = FIFOQueue<(user: String, event: QueuedEvent, deadline: Instant)>()

    /// `configuration.dedupWindow` in milliseconds and in nanoseconds, worked out once
    /// (every message needs them).
    private let dedupWindowMilliseconds: UInt64
    private let dedupWindowNanoseconds: UInt64

    init(
        configuration: SwitchboardConfiguration, epoch: Instant, journaling: Bool = false,
        shard: ShardMap = .single, ledger: MemoryLedger = MemoryLedger(), shardLedgers: [MemoryLedger]? = nil,
        callDirectory: CallDirectory = CallDirectory()
    ) {
        self.configuration = configuration
        self.shardMap = shard
        self.ledger = ledger
        self.shardLedgers = shardLedgers ?? [ledger]
        self.callDirectory = callDirectory
        dedupWindowMilliseconds = UInt64(configuration.dedupWindow.milliseconds)
        dedupWindowNanoseconds = configuration.dedupWindow.wholeNanoseconds
        self.epoch = epoch
        self.journaling = journaling
    }

    /// The durable changes made since the last call (nil when there are none).
    mutating func takeCommitUnit() -> CommitUnit? {
        guard hasCommitUnit else {
            discardCommitUnit()
            return nil
        }
        return takeNonEmptyCommitUnit()
    }

    /// Whether the current operation has a unit for the writer (`takeCommitUnit` would
    /// return one).
    var hasCommitUnit: Bool { !unit.isEmpty }

    /// Drops the current operation's unit, which holds nothing for the writer (a step of a
    /// message that changed nothing durable).
    mutating func discardCommitUnit() {
        unit = CommitUnit()
    }

    /// The current operation's unit, which `hasCommitUnit` says holds something. Not an
    /// optional, for `Switchboard`'s holds: an optional unit was destroyed through value
    /// witnesses in every hold, about 160 instructions (callgrind, issue 16).
    mutating func takeNonEmptyCommitUnit() -> CommitUnit {
        var taken = CommitUnit()
        swap(&taken, &unit)
        taken.shard = shardMap.index
        return taken
    }

    /// Ties the current operation's commit unit to a message, and records `queued`, the
    /// message's event this hold queued (`DeferredReply.add`): the message's OK waits
    /// until the unit is committed (`answers`), or the unit is one step of a message whose
    /// answering unit comes later (`answers` false).
    mutating func deferReply(_ reply: DeferredReply, answers: Bool = true, queued: QueuedEvent?) {
        if let queued { recordPart(queued, of: reply) }
        unit.reply = reply
        unit.group = reply
        unit.closesGroup = answers
    }

    /// The current operation's commit unit is committed on its own after all: a hold that
    /// a message's step spends on work that is no part of the message (a claim of held
    /// messages, `helpClaim`), whose changes must not be undone if the message is refused.
    mutating func commitsAlone() {
        unit.reply = nil
        unit.group = nil
        unit.closesGroup = true
    }

    /// The message whose deferred OK the current operation's commit unit is tied to (nil:
    /// none), for a fan-out that ties its later holds' units to it too (`FanOut`).
    var deferredMessage: DeferredReply? { unit.reply }

    /// The group the current operation's commit unit belongs to (nil: none), for work
    /// that goes on in later holds whose units must join it too (`DeviceBroadcast`).
    var committingGroup: CommitGroup? { unit.group }

    /// Makes the current operation's commit unit one step of `group`, which a later unit
    /// closes (with a store; without one, nothing).
    mutating func join(_ group: CommitGroup) {
        guard journaling else { return }
        unit.group = group
        unit.closesGroup = false
    }

    /// With a store, when the current operation hands `next` to other shards (receipts of
    /// an ACK), starts a group with its commit unit, for `Switchboard.run(_:now:wall:writerWake:committedWith:)`
    /// to put the steps' units in and close; nil without a store or steps.
    mutating func group(for next: [ShardStep]) -> CommitGroup? {
        guard journaling, !next.isEmpty else { return nil }
        return operationGroup()
    }

    /// With a store, the group of the current hold's commit unit, started now if it has
    /// none: for the steps the operation hands on (`group(for:)`; an ACK's first receipt
    /// for another shard's sender, `EventLoop.AcknowledgementSteps`).
    mutating func operationGroup() -> CommitGroup {
        precondition(journaling, "a commit group without a store")
        // Started already by a receipt whose copies take several holds (`deliverReceipt`).
        if let started = unit.group { return started }
        let group = CommitGroup()
        join(group)
        return group
    }

    /// Adds a durable change to the current operation's commit unit (with a store only).
    mutating func journal(_ change: StoreChange) {
        if journaling { unit.add(change) }
    }

    /// Seconds on the device-record timeline, rounded down. It starts 2^31 s in (68
    /// years), so that devices loaded from the store can be placed in the past.
    func second(_ instant: Instant) -> UInt32 {
        UInt32(1 << 31) &+ UInt32(clamping: instant.wholeSeconds(since: epoch))
    }

    // MARK: Records

    func devices(of userID: String) -> DeviceList { DeviceList(first: users[userID]) }

    /// Debug builds: `device` is one of this shard's records (a loop passed a record to the
    /// shard of its user, not another).
    @inline(__always)
    func assertOwns(_ device: DeviceRecord) {
        assert(shardMap.owns(device.userID), "device of \(device.userID) given to shard \(shardMap.index) of \(shardMap.count)")
    }

    func device(_ userID: String, _ deviceID: String) -> DeviceRecord? {
        devices(of: userID).first { $0.deviceID == deviceID }
    }

    mutating func activity(_ userID: String) -> UserActivity {
        if let existing = activities[userID] { return existing }
        let created = UserActivity()
        activities[userID] = created
        return created
    }

    /// Drops a user's activity record once it holds nothing.
    mutating func compactActivity(_ userID: String) {
        if let activity = activities[userID], activity.isEmpty { activities[userID] = nil }
    }

    private mutating func addDevice(_ device: DeviceRecord) {
        device.next = users[device.userID]
        users[device.userID] = device
    }

    mutating func removeDevice(_ device: DeviceRecord) {
        activities[device.userID]?.fanOutDeviceForgotten(device)  // before `next` is cleared
        activities[device.userID]?.broadcastDeviceForgotten(device)  // the same
        forgetAcknowledgement(of: device)
        if users[device.userID] === device {
            users[device.userID] = device.next
        } else {
            var current = users[device.userID]
            while let candidate = current, candidate.next !== device { current = candidate.next }
            current?.next = device.next
        }
        device.next = nil
        activities[device.userID]?.claimingDeviceForgotten(device, next: users[device.userID])
        pushRegistrations[ObjectIdentifier(device)] = nil
        stopTrackingShares(of: .device(ObjectIdentifier(device)), events: device.forEachEvent)
        counters.pendingEvents -= device.queue.count
    }

    // MARK: Handshake

    /// Binds a connection to its device after a HELLO: resumes the device's session or
    /// starts a new one, and evicts an older connection of the same device.
    mutating func attach(
        userID: String, deviceID: String, resume: ResumePoint?, connection: ConnectionRef, now: Instant,
        into effects: inout [SwitchboardEffect]
    ) -> Result<AttachGrant, ProtocolViolation> {
        var device = self.device(userID, deviceID)
        var sentSeq: UInt64
        var resumed = false
        var receipts: [ShardStep] = []

        if let resume {
            guard let known = device, known.sessionID == resume.sessionID else {
                return .failure(ProtocolViolation(
                    .sessionUnknown, "session \(resume.sessionID) is unknown or expired; start a new session"))
            }
            // Events written before their commit (`Delivery.immediate`) carry reserved
            // numbers, which a restarted server knows too: even after a crash, a device has
            // seen nothing beyond `lastSeq`.
            guard resume.lastReceivedSeq <= known.lastSeq else {
                return .failure(ProtocolViolation(
                    .invalidSequence,
                    "resume point \(resume.lastReceivedSeq) is beyond the last event sent (\(known.lastSeq))"))
            }
            receipts = acknowledge(known, through: resume.lastReceivedSeq, into: &effects)
            sentSeq = max(acknowledgedSeq(of: known), resume.lastReceivedSeq)
            resumed = true
        } else if let known = device {
            known.sessionID = SessionID.random(using: &random)
            sentSeq = acknowledgedSeq(of: known)
        } else {
            let created = DeviceRecord(userID: userID, deviceID: deviceID, sessionID: SessionID.random(using: &random))
            addDevice(created)
            device = created
            sentSeq = 0
        }
        let record = device!
        if !resumed {
            journal(.upsertDevice(user: userID, device: deviceID, sessionID: record.sessionID, lastSeen: currentWall))
        }
        // Numbers for what comes next, so that events can go out before their commit.
        let window = reservationWindow(of: record)
        if UInt64(record.reservedAhead) < window - window / 4 {
            reserve(record, through: record.lastSeq + window)
        }

        let reconnected = record.connection == nil
        if let old = record.connection, old != connection {
            effects.append(.close(old, Close(
                code: .replaced, message: "another connection of device \(deviceID) took over this session")))
        }
        record.connection = connection
        record.disconnectedSecond = 0
        // Events already waiting are written right after WELCOME; new ones (held messages,
        // a ringing call) wake the connection like any other.
        let needsPump = record.writableSeq > sentSeq
        record.wakePending = needsPump

        var claim: ShardStep?
        if let activity = activities[userID] {
            // Messages that waited for this user's first device: the first chunk now, the
            // rest in steps of their own (a call rings at once, ahead of the rest).
            claim = startClaim(activity, for: record, into: &effects)
            ringIfCalled(record, activity, reconnected: reconnected, into: &effects)
        }
        return .success(AttachGrant(
            record: record, sessionID: record.sessionID, resumed: resumed, ackedSeq: acknowledgedSeq(of: record), sentSeq: sentSeq,
            lastSeq: record.lastSeq, needsPump: needsPump, next: receipts, claim: claim))
    }

    /// A callee device that connects while a call rings is rung too (now, and not again by
    /// the call's next chunk if it was still to be rung: `CallRecord.markRung`); one rung
    /// before that had lost its connection (`reconnected`) counts as connected again. Costs
    /// a set look-up per call ringing the user, whatever the number of its devices.
    private mutating func ringIfCalled(
        _ device: DeviceRecord, _ activity: UserActivity, reconnected: Bool, into effects: inout [SwitchboardEffect]
    ) {
        for call in activity.calls where call.callee == device.userID && call.state.isUnanswered {
            if call.markRung(device) {
                enqueue(call.invitation, to: device, into: &effects)
            } else if reconnected {
                call.rungDeviceConnected(device)
            }
        }
    }

    /// The connection is gone. The session stays resumable for `sessionTTL`; calls the
    /// device takes part in end unless it comes back within `callGrace`.
    mutating func detach(_ device: DeviceRecord, connection: ConnectionRef, now: Instant) {
        assertOwns(device)
        guard device.connection == connection else { return }  // already taken over
        device.connection = nil
        device.wakePending = false
        device.disconnectedSecond = second(now)
        armExpiry(device)
        journal(.upsertDevice(user: device.userID, device: device.deviceID, sessionID: device.sessionID, lastSeen: currentWall))
        let graceDeadline = now + configuration.callGrace
        for call in activities[device.userID]?.calls ?? [] where call.isLive && involves(call, device) {
            if call.state.isUnanswered { call.rungDeviceDisconnected(device) }
            call.setGraceDeadline(graceDeadline, of: device)
            graceChecks.push((call, device, graceDeadline))
        }
        for call in activities[device.userID]?.outgoingCalls ?? [] where call.device === device {
            call.graceDeadline = graceDeadline
            callerGraceChecks.push((call, graceDeadline))
        }
        if evictsBodies {
            device.queue.forEach(after: acknowledgedSeq(of: device)) { _, event in
                evictIfUnwanted(event)
                return true
            }
        }
    }

    /// Makes sure the offline `device` has its session-expiry and device-expiry entries.
    /// An entry it still has (from an earlier disconnect) is due no later than the new
    /// deadline, since every disconnect has the same TTL: it stays, and `expire` re-arms it.
    private mutating func armExpiry(_ device: DeviceRecord) {
        if !device.expiryEntries.contains(.session) { enterExpiry(device, .session) }
        if !device.expiryEntries.contains(.device) { enterExpiry(device, .device) }
    }

    private mutating func enterExpiry(_ device: DeviceRecord, _ kind: DeviceRecord.ExpiryEntries) {
        device.expiryEntries.insert(kind)
        let entry = DeadlineHeap<UInt32, DeviceRecord, Void>.Entry(deadline: expiryDue(device, kind), key: device, stamp: ())
        if kind == .session { sessionExpiry.insert(entry) } else { deviceExpiry.insert(entry) }
    }

    /// The second at which the session (or device) TTL has passed since the device's
    /// disconnect: one more than `disconnectedSecond + TTL`, since the disconnect may have
    /// been late in its second.
    private func expiryDue(_ device: DeviceRecord, _ kind: DeviceRecord.ExpiryEntries) -> UInt32 {
        let ttl = kind == .session ? configuration.sessionTTL : configuration.eventTTL
        return device.disconnectedSecond &+ ttl.wholeSecondsRoundedUp &+ 1
    }

    // MARK: Delivery

    /// Queues `event` for `device`. Returns false (and drops the event) when the device's
    /// queue is full; callers that must not lose an event check `hasRoom` first.
    /// `heldOrdinal`: the event was held for the device's user under this ordinal, and the
    /// store copies it from there (its body may no longer be in memory).
    @discardableResult
    mutating func enqueue(
        _ event: QueuedEvent, to device: DeviceRecord, heldOrdinal: UInt64? = nil, into effects: inout [SwitchboardEffect]
    ) -> Bool {
        guard device.queue.count < configuration.maxPendingEvents else {
            counters.eventsDropped += 1
            return false
        }
        // Whether this event's number is reserved (see `DeviceRecord.reservedAhead`).
        let reserved = device.reservedAhead > 0
        if reserved { device.reservedAhead -= 1 }
        let seq = device.append(event)
        counters.eventsQueued += 1
        if device.connection == nil { event.waitedForDevice = true }
        counters.pendingEvents += 1
        shareAdded(event, to: .device(ObjectIdentifier(device)), count: device.queue.count, events: device.forEachEvent)
        if journaling {
            if let heldOrdinal {
                unit.add(.claimHeldEvent(user: device.userID, device: device.deviceID, seq: seq, ordinal: heldOrdinal))
            } else {
                unit.add(.appendEvent(user: device.userID, device: device.deviceID, event: StoredEvent(
                    seq: seq, type: event.encoded.type.rawValue, body: event.encoded.body,
                    receipt: event.receipt.map { StoredReceipt(sender: $0.sender, messageID: $0.messageID, recipient: $0.recipient) },
                    createdAt: event.createdAt)))
            }
            let mayGoEarly = device.connection != nil && releasesBeforeCommit
            if mayGoEarly {
                if !reserved && !device.reservationGrowing && device.reservationScale < Self.maximumReservationScale {
                    device.reservationScale += 1  // outrun: reserve further ahead from now on
                    device.reservationGrowing = true
                    reserve(device, through: seq + reservationWindow(of: device))
                } else if seq % (reservationWindow(of: device) / 4) == 0 {
                    reserve(device, through: seq + reservationWindow(of: device))
                }
            }
            if mayGoEarly && reserved {
                // Written now; the commit no longer gates it (and, acknowledged quickly,
                // the store batch drops it before it reaches the disk). Its number is
                // reserved, so a crash before the commit cannot make it reused.
                device.writableSeq = seq
                if !event.awaitsDecision { announce(device, about: event, into: &effects) }
            } else {
                unit.durable.append((device, seq, event))
            }
        } else {
            device.writableSeq = seq
            if !event.awaitsDecision { announce(device, about: event, into: &effects) }
        }
        return true
    }

    /// How many numbers ahead of its last event a device's reservation reaches, at first. A
    /// new reservation is asked for every quarter window, so a device that keeps receiving
    /// finds its numbers reserved; when events outrun it anyway (they then wait for their
    /// commit), the device's window doubles, up to `reservationWindow << maximumReservationScale`.
    /// A restarted server skips at most one window of numbers per device, and fills them
    /// with a pointer each for a device that has events pending.
    static let reservationWindow: UInt64 = 64
    static let maximumReservationScale: UInt8 = 10

    private func reservationWindow(of device: DeviceRecord) -> UInt64 {
        Self.reservationWindow << UInt64(device.reservationScale)
    }

    /// Reserves `device`'s numbers through `through` (with a store and immediate delivery).
    private mutating func reserve(_ device: DeviceRecord, through: UInt64) {
        guard journaling && configuration.delivery == .immediate else { return }
        unit.add(.reserveSequence(user: device.userID, device: device.deviceID, through: through))
        unit.reservations.append((device, through))
    }

    /// A reservation is committed.
    mutating func confirmReservation(_ device: DeviceRecord, through: UInt64) {
        device.reservationGrowing = false
        guard through > device.lastSeq else { return }
        device.reservedAhead = max(device.reservedAhead, UInt32(clamping: through - device.lastSeq))
    }

    /// Whether events for connected devices skip the wait for their commit.
    var releasesBeforeCommit: Bool { configuration.delivery == .immediate && storeHealthy }

    func hasRoom(_ device: DeviceRecord) -> Bool {
        device.queue.count < configuration.maxPendingEvents
    }

    /// Events up to `seq` of `device` are committed: they may be written now.
    mutating func markDurable(
        _ device: DeviceRecord, through seq: UInt64, about event: QueuedEvent, into effects: inout [SwitchboardEffect]
    ) {
        guard seq > device.writableSeq else { return }
        device.writableSeq = seq
        announce(device, about: event, into: &effects)
    }

    mutating func announce(_ device: DeviceRecord, about event: QueuedEvent, into effects: inout [SwitchboardEffect]) {
        announce(device, event.wakeUpKind, conversation: event.receipt?.sender, into: &effects)
    }

    /// Wakes the device's connection, or asks for a push wake-up if it has none (whether
    /// one is sent depends on the gateway; without one it is only logged).
    private mutating func announce(
        _ device: DeviceRecord, _ kind: WakeUpKind, conversation: String? = nil, into effects: inout [SwitchboardEffect]
    ) {
        if let connection = device.connection {
            if !device.wakePending {
                device.wakePending = true
                effects.append(.wake(connection))
            }
        } else if let registrations = pushRegistrations[ObjectIdentifier(device)],
            pushRouting?.canWake(kind, registrations) ?? true
        {
            // Without a gateway the wake-up is only logged (ServerContext.requestWakeUp).
            effects.append(.wakeUp(WakeUp(
                userID: device.userID, deviceID: device.deviceID, registrations: registrations, kind: kind,
                pendingEvents: device.queue.count, conversation: conversation)))
        }
    }

    /// Asks for a push wake-up of an offline device without queueing anything (a call
    /// rings a device only once it connects).
    mutating func wakeUpOffline(_ device: DeviceRecord, _ kind: WakeUpKind, into effects: inout [SwitchboardEffect]) {
        guard !device.isOnline else { return }
        announce(device, kind, into: &effects)
    }

    /// Hands `body` the next events to write to `connection` after `sentSeq`, with their
    /// sequence numbers: committed ones only, cancelled ones skipped, at most `limit` of
    /// them, and none after one for which `body` returns false (it is full). Stops before
    /// an event whose body is not in memory (`waitsForBody`: the store must hand it back
    /// first), and before one that awaits its decision (`QueuedEvent.awaitsDecision`: the
    /// decision wakes the connection). Returns nil when the connection no longer speaks for the device (it was
    /// taken over), else the new write position.
    ///
    /// Changes only the device record (a class), never the state itself (it reads the
    /// acknowledgement in progress, `acknowledgedSeq(of:)`): the `Switchboard` runs it under
    /// its lock without the bookkeeping of a state change.
    func nextBatch(
        for device: DeviceRecord, connection: ConnectionRef, after sentSeq: UInt64, limit: Int,
        _ body: (UInt64, QueuedEvent) -> Bool
    ) -> (position: UInt64, waitsForBody: UInt64?)? {
        assertOwns(device)
        guard device.connection == connection else { return nil }
        device.wakePending = false
        var position = max(sentSeq, acknowledgedSeq(of: device))
        let writable = device.writableSeq
        var handed = 0
        var full = false
        var waitsForBody: UInt64?
        device.queue.forEach(after: position) { seq, event in
            guard seq <= writable else { return false }
            guard handed < limit, !event.awaitsDecision else {
                full = true  // stops here: the numbers after `position` are not all written
                return false
            }
            if !event.isCancelled && !event.isResident {
                waitsForBody = seq
                return false
            }
            position = seq
            if !event.isCancelled {
                handed += 1
                guard body(seq, event) else {
                    full = true
                    return false
                }
            }
            return true
        }
        // Every event up to `writable` was handed over: the numbers left are holes.
        return (full || waitsForBody != nil ? position : max(position, writable), waitsForBody)
    }

    /// Takes `event`, numbered `seq`, out of `device`'s queue (a device this shard still
    /// knows), if it is still there (an event refused after it was queued): its number
    /// becomes a hole, which counts as acknowledged, and its room is free again.
    mutating func withdraw(_ event: QueuedEvent, seq: UInt64, from device: DeviceRecord) {
        guard device.queue.event(seq) === event else { return }  // acknowledged, or the device forgotten
        let shareQueue = ShareQueue.device(ObjectIdentifier(device))
        let sharesTracked = sharesTracked(shareQueue, count: device.queue.count)
        _ = device.withdraw(seq)
        counters.pendingEvents -= 1
        if sharesTracked && event.receipt != nil {
            trackedSharesRemoved([event], from: shareQueue, count: device.queue.count, events: device.forEachEvent)
        }
        journal(.withdrawEvent(user: device.userID, device: device.deviceID, seq: seq))
    }

    /// MESSAGE_DELIVERED to every device of the message's sender, a chunk of them in this
    /// hold (`DeviceBroadcast`: a sender with more devices, or with a broadcast in
    /// progress, gets the rest from the returned step, the sender's receipts in the order
    /// they were made on every device); returns how many copies this hold queued, and the
    /// step. With a store, every hold of it joins the acknowledgement's commit group (one
    /// is started for the current hold if it has none: `group(for:)` takes it on), so
    /// the acknowledgement and every copy of its receipts are still committed together.
    @discardableResult
    mutating func deliverReceipt(
        _ receipt: DeliveryReceipt, recipientDevice: String, serverTime: UInt64, into effects: inout [SwitchboardEffect]
    ) -> (copies: Int, next: [ShardStep]) {
        // Not counted in the memory ledger: a receipt is small and made for every
        // delivery (a fan-out makes thousands a second), and what a device can hold of
        // them is bounded by --max-pending.
        let delivered = QueuedEvent(
            .messageDelivered(
                messageID: receipt.messageID, recipient: receipt.recipient, recipientDevice: recipientDevice,
                serverTime: serverTime),
            createdAt: currentWall, createdNanos: currentNanos)
        let before = counters.eventsQueued
        let next = broadcastToEveryDevice(delivered, of: receipt.sender, startsGroup: true, into: &effects)
        return (counters.eventsQueued - before, next)
    }

    /// Whether the callee's `device` takes part in `call` (rung, or answered it).
    func involves(_ call: CallRecord, _ device: DeviceRecord) -> Bool {
        guard call.callee == device.userID else { return false }
        switch call.state {
        case .inviting, .ringing: return call.wasRung(device)
        case .active(let answeredBy): return answeredBy == device.deviceID
        case .ended: return false
        }
    }

    // MARK: Push registration

    /// Stores the device's token of `registration.kind`, replacing its earlier one of that
    /// kind only; an empty token removes the device's token of that kind. Refuses an APNs
    /// environment other than production or sandbox (badRequest).
    @discardableResult
    mutating func registerPush(_ registration: PushRegistration, for device: DeviceRecord) -> Result<Void, RequestError> {
        guard ["", "production", "sandbox"].contains(registration.environment) else {
            return .failure(RequestError(.badRequest, "push environment '\(registration.environment)' is neither production nor sandbox"))
        }
        let key = ObjectIdentifier(device)
        var registrations = pushRegistrations[key] ?? []
        if registration.token.isEmpty {
            guard registrations.unregister(registration.kind) else { return .success(()) }
            journal(.removePush(user: device.userID, device: device.deviceID, kind: registration.kind))
        } else {
            registrations.register(registration)
            journal(.registerPush(user: device.userID, device: device.deviceID, registration: registration))
        }
        pushRegistrations[key] = registrations.isEmpty ? nil : registrations
        return .success(())
    }

    /// Removes a token the push service refused as no longer valid, unless the device has
    /// registered another one of that kind meanwhile. True if it was removed.
    mutating func removeRejectedPushToken(user userID: String, device deviceID: String, _ rejected: PushRegistration) -> Bool {
        guard let device = device(userID, deviceID) else { return false }
        let key = ObjectIdentifier(device)
        guard var registrations = pushRegistrations[key],
            registrations.contains(where: { $0.kind == rejected.kind && $0.token == rejected.token })
        else { return false }
        registrations.unregister(rejected.kind)
        pushRegistrations[key] = registrations.isEmpty ? nil : registrations
        journal(.removePush(user: userID, device: deviceID, kind: rejected.kind))
        return true
    }

    // MARK: Deadlines

    mutating func scheduleRingTimeout(_ call: CallRecord, now: Instant) {
        ringExpiry.push((call, now + configuration.ringTimeout))
    }

    /// Remembers a sender's message id for the de-duplication window, in `activity`, the
    /// sender's (looked up once by the caller, which checked the id against it).
    mutating func rememberMessageID(
        _ messageID: String, sender: String, serverTime: UInt64, now: Instant, in activity: UserActivity
    ) {
        activity.recentMessageIDs[messageID] = serverTime
        dedupExpiry.push((sender, messageID, now.adding(nanoseconds: dedupWindowNanoseconds)))
        journal(.rememberMessageID(StoredMessageID(
            sender: sender, messageID: messageID, serverTime: serverTime, expiresAt: currentWall + dedupWindowMilliseconds)))
        // Bound memory under a message flood: forget the oldest ids early.
        while dedupExpiry.count > configuration.dedupCapacity, let oldest = dedupExpiry.pop() {
            forgetMessageID(oldest.messageID, sender: oldest.sender)
        }
    }

    mutating func forgetMessageID(_ messageID: String, sender: String) {
        guard let activity = activities[sender], let serverTime = activity.recentMessageIDs.removeValue(forKey: messageID) else { return }
        journal(.forgetMessageID(sender: sender, messageID: messageID, serverTime: serverTime))
        compactActivity(sender)
    }

    mutating func hold(_ event: QueuedEvent, for userID: String, now: Instant) {
        let activity = activity(userID)
        assert(activity.claim == nil, "a message to \(userID) was held while a device claims the held ones")
        let ordinal = activity.nextHeldOrdinal
        activity.held.append(event)
        event.waitedForDevice = true
        counters.pendingEvents += 1
        shareAdded(event, to: .held(userID), count: activity.held.count, events: activity.forEachHeld)
        heldExpiry.push((userID, event, now + configuration.eventTTL))
        journal(.holdForUser(user: userID, event: StoredEvent(
            seq: ordinal, type: event.encoded.type.rawValue, body: event.encoded.body,
            receipt: event.receipt.map { StoredReceipt(sender: $0.sender, messageID: $0.messageID, recipient: $0.recipient) },
            createdAt: event.createdAt)))
    }

    /// How many deadline entries one `expire` call takes at most (256: a few tens of
    /// microseconds of work, where a mass expiry in one call held the lock for as long as it
    /// took to drop every device).
    static let expiryBudget = 256

    /// Runs the deadlines that have passed at `now`, at most `budget` entries of them (an
    /// entry that turns out stale, such as the expiry of a device that came back, counts
    /// too; so does each event a call's ending queues in the pass, at most a chunk per
    /// call), and returns whether more are due: the caller then calls again, in a new hold
    /// of the lock, so that other loops get the lock in between. Called by one event loop
    /// per tick (`EventLoop.tick`), until it returns false.
    ///
    /// Order: each kind of deadline is taken from its own queue in deadline order, and the
    /// kinds in the order below, so a call that runs out of budget resumes where it
    /// stopped; nothing due is skipped, and a device's session expiry (always due before its
    /// device expiry) still runs first. What is due but waits for the next call is late by
    /// one hold of the lock, never early.
    @discardableResult
    mutating func expire(now: Instant, budget: Int = SwitchboardState.expiryBudget, into effects: inout [SwitchboardEffect]) -> ExpiryPass {
        var budget = budget
        var outcome = StepOutcome(reply: nil)
        let nowSecond = second(now)
        // A call's ending queues its first chunk of devices here (`DeviceBroadcast`): those
        // events count against the budget too, so that a pass that ends many calls is
        // still about one budget of work.
        var counted = counters.eventsQueued
        while budget > 0, let entry = ringExpiry.first, entry.deadline <= now {
            budget -= 1
            ringExpiry.pop()
            if entry.call.isLive && entry.call.state.isUnanswered {
                outcome.merge(ringTimedOut(entry.call, into: &effects))
                budget = max(0, budget - (counters.eventsQueued - counted))
                counted = counters.eventsQueued
            }
        }
        while budget > 0, let entry = graceChecks.first, entry.deadline <= now {
            budget -= 1
            graceChecks.pop()
            let device = entry.device
            // Only the check of the party's latest disconnect acts: after a resume and
            // another loss, the earlier check would end the call early.
            if entry.call.isLive && !device.isOnline && entry.call.graceDeadline(of: device) == entry.deadline {
                outcome.merge(partyVanished(entry.call, device, into: &effects))
                budget = max(0, budget - (counters.eventsQueued - counted))
                counted = counters.eventsQueued
            }
        }
        while budget > 0, let entry = callerGraceChecks.first, entry.deadline <= now {
            budget -= 1
            callerGraceChecks.pop()
            let call = entry.call
            // As above; and the call must not have ended meanwhile.
            if !call.device.isOnline && call.graceDeadline == entry.deadline
                && activities[call.device.userID]?.outgoingCalls.contains(where: { $0 === call }) == true
            {
                outcome.merge(handOn(.callerVanished(callID: call.callID, callee: call.callee, caller: DeviceAddress(call.device)),
                    into: &effects))
            }
        }
        while let device = takeDueExpiry(.session, at: nowSecond, budget: &budget) {
            // No longer resumable: the device must start a new session (its events stay).
            device.sessionID = SessionID.random(using: &random)
            counters.sessionsExpired += 1
            let lastSeen = currentWall &- UInt64(nowSecond &- device.disconnectedSecond) * 1000
            journal(.upsertDevice(user: device.userID, device: device.deviceID, sessionID: device.sessionID, lastSeen: lastSeen))
        }
        while let device = takeDueExpiry(.device, at: nowSecond, budget: &budget) {
            removeDevice(device)
            counters.devicesExpired += 1
            counters.eventsExpired += device.queue.count
            journal(.removeDevice(user: device.userID, device: device.deviceID))
        }
        while budget > 0, let entry = dedupExpiry.first, entry.deadline <= now {
            budget -= 1
            dedupExpiry.pop()
            forgetMessageID(entry.messageID, sender: entry.sender)
        }
        while budget > 0, let entry = heldExpiry.first, entry.deadline <= now {
            budget -= 1
            heldExpiry.pop()
            guard let activity = activities[entry.user], activity.held.first === entry.event else { continue }
            let sharesTracked = sharesTracked(.held(entry.user), count: activity.held.count)
            activity.held.removeFirst()
            counters.pendingEvents -= 1
            if sharesTracked {
                trackedSharesRemoved([entry.event], from: .held(entry.user), count: activity.held.count, events: activity.forEachHeld)
            }
            counters.eventsExpired += 1
            journal(.releaseHeld(user: entry.user, through: activity.firstHeldOrdinal))
            activity.firstHeldOrdinal += 1
            compactActivity(entry.user)
        }
        return ExpiryPass(moreDue: budget == 0 && hasDueDeadline(now: now, nowSecond: nowSecond), next: outcome.next)
    }

    /// What one `expire` call left: whether more deadlines are due, and the steps for
    /// other shards (call endings for callers and callees there).
    struct ExpiryPass {
        let moreDue: Bool
        let next: [ShardStep]
    }

    /// Whether any deadline queue has an entry due at `now` (stale ones included).
    private func hasDueDeadline(now: Instant, nowSecond: UInt32) -> Bool {
        if let entry = ringExpiry.first, entry.deadline <= now { return true }
        if let entry = graceChecks.first, entry.deadline <= now { return true }
        if let entry = callerGraceChecks.first, entry.deadline <= now { return true }
        if let entry = sessionExpiry.first, entry.deadline <= nowSecond { return true }
        if let entry = deviceExpiry.first, entry.deadline <= nowSecond { return true }
        if let entry = dedupExpiry.first, entry.deadline <= now { return true }
        if let entry = heldExpiry.first, entry.deadline <= now { return true }
        return false
    }

    /// Entries in the session-expiry and device-expiry heaps (at most two per device).
    var expiryEntryCount: Int { sessionExpiry.count + deviceExpiry.count }

    /// The next device whose session (or device) TTL since its latest disconnect has
    /// passed at `nowSecond`, its entry taken out. Entries that come due for a device that
    /// is online, or was forgotten, are dropped; those of a device that reconnected and
    /// lost its connection again since are entered again at the real deadline.
    /// Every entry taken counts against `budget`; none is taken once it is spent.
    private mutating func takeDueExpiry(
        _ kind: DeviceRecord.ExpiryEntries, at nowSecond: UInt32, budget: inout Int
    ) -> DeviceRecord? {
        while budget > 0, let first = kind == .session ? sessionExpiry.first : deviceExpiry.first, first.deadline <= nowSecond {
            budget -= 1
            if kind == .session { sessionExpiry.popFirst() } else { deviceExpiry.popFirst() }
            let device = first.key
            device.expiryEntries.remove(kind)
            guard !device.isOnline, self.device(device.userID, device.deviceID) === device else { continue }
            if expiryDue(device, kind) <= nowSecond { return device }
            enterExpiry(device, kind)
        }
        return nil
    }

    // MARK: Restart

    /// Rebuilds the state a store kept. Called once, before any connection.
    mutating func load(_ snapshot: StoredSnapshot, now: Instant) {
        let nowSecond = second(now)
        func age(_ wall: UInt64) -> UInt32 { UInt32(clamping: (currentWall &- min(wall, currentWall)) / 1000) }

        for stored in snapshot.devices.sorted(by: { $0.lastSeen < $1.lastSeen }) {
            let device = DeviceRecord(
                userID: stored.userID, deviceID: stored.deviceID, sessionID: stored.sessionID,
                nextSeq: stored.ackedSeq + 1)
            // Numbers handed out (or reserved) before the restart are never handed out
            // again; those with no stored event are holes, which cost nothing and are not
            // pending.
            device.restore(
                stored.events.compactMap { event in
                    FrameType(rawValue: event.type).map { (event.seq, queuedEvent(event, type: $0)) }
                },
                through: stored.lastSeq)
            device.reservedAhead = 0  // the reservation ends at `stored.lastSeq`
            device.disconnectedSecond = nowSecond &- age(stored.lastSeen)
            addDevice(device)
            if !stored.pushRegistrations.isEmpty { pushRegistrations[ObjectIdentifier(device)] = stored.pushRegistrations }
            armExpiry(device)
        }
        for (userID, events) in snapshot.held {
            guard let first = events.first else { continue }
            let activity = activity(userID)
            activity.firstHeldOrdinal = first.seq
            for event in events {
                guard let type = FrameType(rawValue: event.type) else { continue }
                while activity.nextHeldOrdinal < event.seq { activity.held.append(.placeholder) }
                let queued = queuedEvent(event, type: type)
                activity.held.append(queued)
            }
        }
        let heldByAge = activities.flatMap { userID, activity in activity.held.map { (userID, $0) } }
            .filter { !$0.1.isCancelled }.sorted { $0.1.createdAt < $1.1.createdAt }
        // Nobody is connected yet: every committed message body may leave memory.
        for (_, event) in heldByAge { evictIfUnwanted(event) }
        for head in users.heads {
            for device in DeviceList(first: head) { device.forEachEvent { evictIfUnwanted($0) } }
        }
        retrackShares()
        counters.pendingEvents = activities.values.reduce(0) { $0 + $1.heldEventCount }
            + users.heads.reduce(0) { total, head in DeviceList(first: head).reduce(total) { $0 + $1.queue.count } }
        for (userID, event) in heldByAge {
            let remaining = configuration.eventTTL - .seconds(Int64(age(event.createdAt)))
            heldExpiry.push((userID, event, now + max(.zero, remaining)))
        }
        for stored in snapshot.messageIDs.sorted(by: { $0.expiresAt < $1.expiresAt }) where !stored.hasExpired(at: currentWall) {
            activity(stored.sender).recentMessageIDs[stored.messageID] = stored.serverTime
            dedupExpiry.push((stored.sender, stored.messageID, now + .milliseconds(Int64(stored.expiresAt - currentWall))))
        }
    }

    private func queuedEvent(_ event: StoredEvent, type: FrameType) -> QueuedEvent {
        let queued = QueuedEvent(
            encoded: EncodedEvent(type: type, body: event.body),
            receipt: event.receipt.map {
                DeliveryReceipt(sender: $0.sender, messageID: $0.messageID, recipient: $0.recipient, shards: shardMap)
            },
            createdAt: event.createdAt, ledger: ledger, createdNanos: 0)
        queued.isDurable = true
        return queued
    }
}
