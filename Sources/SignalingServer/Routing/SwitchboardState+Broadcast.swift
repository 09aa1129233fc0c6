import SignalingProtocol
import SignalingSupport

/// One event for many devices of one user (what the end of a call tells the callee's
/// devices: answeredElsewhere, declinedElsewhere, cancelled, noAnswer), queued to them a
/// chunk per hold of the user's shard (`SwitchboardConfiguration.fanOutChunk` devices, the
/// fan-out's constant): the hold that decides it queues the first chunk, and its
/// `ShardStep.continueBroadcast` steps the rest, each a task of the shard's owner loop like
/// a fan-out's next chunk (docs/ARCHITECTURE.md, "Call endings in chunks"). An accept's
/// answeredElsewhere to 1,000 devices took one hold of about 210 µs (docs/LOAD-TESTING.md,
/// "Bounded holds").
///
/// The devices are a list (`listed`: the devices a call rang, in the order it rang them),
/// or every device of the user, walked from the head of the user's device list as it was
/// when the broadcast was decided (`cursor`: devices added since are at the head, so not
/// reached, as they would not have been in one hold).
///
/// Invariants:
/// - Exactly once: each device gets the event once, from the chunk that reaches it,
///   whatever happens to its connection meanwhile (a disconnect, a resume or a new session
///   keeps its queue, and nothing else queues the event). A device forgotten meanwhile is
///   skipped (`forget`).
/// - Order: a device gets the event after everything queued to it before the broadcast was
///   decided. A user has at most one broadcast in progress, the head of
///   `UserActivity.broadcasts`: one decided meanwhile waits behind it, whatever its size,
///   and each hold of its own step meanwhile runs the head's next chunk (as a message waits
///   for a fan-out in progress, `FanOut`), so every device gets a user's broadcasts in the
///   order they were decided (two calls ended one after the other end in that order on
///   every device). Nothing else waits for a broadcast: an event queued meanwhile (a
///   message, a new call's CALL_INCOMING) may come before it on a device its chunk has not
///   reached yet, as it would have had it been queued a moment before the decision.
/// - What the event reports took effect in the deciding hold: the call is answered or over
///   there ("first accept wins" is decided in one hold; a second accept meanwhile is
///   refused, and a device that connects meanwhile is not rung).
/// - Every broadcast has its own step until it is finished (its chain finishes after it:
///   `Switchboard.run`), whichever step ran its chunks. With a store, each hold that runs
///   a chunk hands its changes in as a unit of the broadcast's commit group (`group`: the
///   one of the hold that decided it; none for a call's ending, whose chunks are committed
///   in the shard's order, each on its own), as a fan-out's chunks join their message's
///   (`FanOut.committedWith`). Calls are not stored: after a crash mid-way the call is gone
///   with or without its ending on the devices not reached.
///
/// Memory: a broadcast counts in the memory ledger (`--memory-budget`) while it lives, its
/// event too if that is not counted already (a receipt's is not): the receipts of a sender
/// with more devices than a chunk wait behind the broadcast in progress as objects of
/// their own, one per acknowledged message, not yet copies in the devices' queues, so
/// `--max-pending` does not bound them; the budget does (past it, new messages and calls
/// are refused until they have gone out).
///
/// Guarded by the lock of the user's shard, like the records it points to.
final class DeviceBroadcast: @unchecked Sendable {
    /// Names the broadcast in its shard (`SwitchboardState.broadcasts`) and in its step.
    let id: UInt64
    let user: String
    let event: QueuedEvent
    /// The devices still to get it, in order, before those from `cursor` on.
    var listed: ArraySlice<DeviceRecord>
    /// The next device of the user's list to get it, after `listed` (nil: none).
    var cursor: DeviceRecord?
    /// A device not to get it (the one whose request decided it).
    let skipping: DeviceRecord?
    /// With a store, the commit group every hold of it joins (nil: none).
    let group: CommitGroup?
    /// Devices of `listed` forgotten since it started (their queues were counted out).
    var forgotten: Set<ObjectIdentifier> = []
    /// Where its memory is counted, and how much (`footprint`, and its event's if the event
    /// counts nowhere else).
    private let ledger: MemoryLedger
    private let charged: Int

    /// What a broadcast costs in memory, near enough for a budget: the object, its entries
    /// in its user's list and its shard's table, and its step waiting in an inbox.
    static let footprint = 256

    init(
        id: UInt64, user: String, event: QueuedEvent, listed: ArraySlice<DeviceRecord>, cursor: DeviceRecord?,
        skipping: DeviceRecord?, group: CommitGroup?, ledger: MemoryLedger
    ) {
        self.id = id
        self.user = user
        self.event = event
        self.listed = listed
        self.cursor = cursor
        self.skipping = skipping
        self.group = group
        self.ledger = ledger
        charged = Self.footprint + (event.isCounted ? 0 : QueuedEvent.footprint(of: event.encoded))
        ledger.add(charged)
    }

    deinit {
        ledger.add(-charged)
    }

    var isFinished: Bool { listed.isEmpty && cursor == nil }

    /// `device` is being forgotten (unlinked from its user's list): the walk steps over it
    /// (called before its `next` is cleared), and it is skipped in `listed`.
    func forget(_ device: DeviceRecord) {
        if cursor === device { cursor = device.next }
        if !listed.isEmpty { forgotten.insert(ObjectIdentifier(device)) }
    }
}

extension UserActivity {
    /// `device` was unlinked from the user's list (`next` not cleared yet): no broadcast
    /// in progress or waiting queues to it.
    func broadcastDeviceForgotten(_ device: DeviceRecord) {
        broadcasts.forEach { $0.forget(device) }
    }
}

extension SwitchboardState {
    /// Queues `event` to `devices` of `user` (but `skipping`), in that order, at most a
    /// chunk of them in this hold, and returns the broadcast's step, which queues the rest
    /// (none: all done). A broadcast of a chunk or fewer with none in progress for the user
    /// is queued whole now, as before chunks.
    mutating func broadcast(
        _ event: QueuedEvent, to devices: [DeviceRecord], of user: String, skipping: DeviceRecord? = nil,
        into effects: inout [SwitchboardEffect]
    ) -> [ShardStep] {
        guard !devices.isEmpty else { return [] }
        if !broadcastInProgress(for: user) && devices.count <= configuration.fanOutChunk {
            for device in devices where device !== skipping { enqueue(event, to: device, into: &effects) }
            return []
        }
        return start(event, of: user, listed: devices[...], cursor: nil, skipping: skipping, into: &effects)
    }

    /// Queues `event` to every device of `user`, as `broadcast(_:to:of:skipping:)` does,
    /// walking the user's device list (no copy of it). With none in progress for the user,
    /// the first chunk goes now and nothing is allocated unless devices are left after it
    /// (the usual case: a handful of devices, a receipt for every message). `startsGroup`:
    /// with a store, a broadcast that takes several holds starts a commit group with the
    /// current hold's unit if it has none (`start`).
    mutating func broadcastToEveryDevice(
        _ event: QueuedEvent, of user: String, startsGroup: Bool = false, into effects: inout [SwitchboardEffect]
    ) -> [ShardStep] {
        guard let first = users[user] else { return [] }
        guard !broadcastInProgress(for: user) else {
            return start(event, of: user, listed: [], cursor: first, skipping: nil, startsGroup: startsGroup, into: &effects)
        }
        var next: DeviceRecord? = first
        var budget = configuration.fanOutChunk
        while budget > 0, let device = next {
            enqueue(event, to: device, into: &effects)
            next = device.next
            budget -= 1
        }
        guard let rest = next else { return [] }
        return start(event, of: user, listed: [], cursor: rest, skipping: nil, startsGroup: startsGroup, firstChunkDone: true,
            into: &effects)
    }

    /// Whether `user` has a broadcast in progress. Every one is in `broadcasts` too (entered
    /// and removed together), so with none in the shard (the usual case) the user's
    /// activity is not looked up: hashing the id for every receipt was about 170
    /// instructions per event of `routing-bench scaling` (callgrind, issue 16).
    private func broadcastInProgress(for user: String) -> Bool {
        !broadcasts.isEmpty && !(activities[user]?.broadcasts.isEmpty ?? true)
    }

    /// Enters a broadcast behind the user's others (if any), runs its first chunk if it is
    /// the only one (and the caller has not: `firstChunkDone`), and returns its step (none:
    /// finished in this hold). Its group, with a store, is the current hold's (nil for a
    /// call's decision: its chunks are committed each on its own), or, with `startsGroup`,
    /// one it starts for the current hold if that has none: for the hold that receives an
    /// acknowledgement, whose group is closed by the chain that runs the steps it hands on
    /// (`group(for:)` returns this one then). A step's hold has joined its chain's group
    /// before it runs (`Switchboard.run`), so it starts none.
    private mutating func start(
        _ event: QueuedEvent, of user: String, listed: ArraySlice<DeviceRecord>, cursor: DeviceRecord?, skipping: DeviceRecord?,
        startsGroup: Bool = false, firstChunkDone: Bool = false, into effects: inout [SwitchboardEffect]
    ) -> [ShardStep] {
        var group = journaling ? committingGroup : nil
        if journaling && group == nil && startsGroup {
            let started = CommitGroup()
            join(started)
            group = started
        }
        nextBroadcastID += 1
        let broadcast = DeviceBroadcast(
            id: nextBroadcastID, user: user, event: event, listed: listed, cursor: cursor, skipping: skipping, group: group,
            ledger: ledger)
        let activity = activity(user)
        let waits = !activity.broadcasts.isEmpty
        activity.broadcasts.push(broadcast)
        broadcasts[broadcast.id] = broadcast
        if !waits && !firstChunkDone { broadcastChunk(of: activity, into: &effects) }
        guard broadcasts[broadcast.id] != nil else { return [] }
        return [.continueBroadcast(user: user, id: broadcast.id)]
    }

    /// Broadcast `id`'s step: runs the next chunk of the user's broadcast in progress (its
    /// own, or, while it waits, the one ahead of it), and returns itself again until its
    /// broadcast is finished (nothing: finished meanwhile, or its user forgotten).
    mutating func continueBroadcast(_ user: String, id: UInt64, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard broadcasts[id] != nil else { return StepOutcome(reply: nil) }
        guard let activity = activities[user], !activity.broadcasts.isEmpty else {
            broadcasts[id] = nil  // not in its user's list: cannot happen, but must not spin
            return StepOutcome(reply: nil)
        }
        broadcastChunk(of: activity, into: &effects)
        guard broadcasts[id] != nil else { return StepOutcome(reply: nil) }
        return StepOutcome(reply: nil, next: [.continueBroadcast(user: user, id: id)])
    }

    /// Queues the next chunk of the user's broadcast in progress (the head of its list),
    /// its changes a unit of that broadcast's group; a finished broadcast leaves the list.
    private mutating func broadcastChunk(of activity: UserActivity, into effects: inout [SwitchboardEffect]) {
        guard let head = activity.broadcasts.first else { return }
        if let group = head.group {
            assert(deferredMessage == nil, "a message's hold ran a chunk of a broadcast")
            join(group)
        }
        var budget = configuration.fanOutChunk
        while budget > 0, let device = head.listed.first {
            head.listed = head.listed.dropFirst()
            budget -= 1
            guard device !== head.skipping else { continue }
            if !head.forgotten.isEmpty && head.forgotten.contains(ObjectIdentifier(device)) { continue }
            enqueue(head.event, to: device, into: &effects)
        }
        while budget > 0, let device = head.cursor {
            head.cursor = device.next
            budget -= 1
            if device !== head.skipping { enqueue(head.event, to: device, into: &effects) }
        }
        guard head.isFinished else { return }
        activity.broadcasts.pop()
        broadcasts[head.id] = nil
        if activity.broadcasts.isEmpty { compactActivity(head.user) }
    }
}
