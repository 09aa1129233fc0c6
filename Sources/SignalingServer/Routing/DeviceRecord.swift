import SignalingProtocol
import SignalingSupport

/// Identifies a live connection: the event loop that owns it, its slot in that loop's
/// connection table, and the slot's generation (a slot reused by a later connection has a
/// new generation, so stale references are recognised and ignored).
public struct ConnectionRef: Hashable, Sendable, CustomStringConvertible {
    public var loop: UInt16
    public var slot: UInt32
    public var generation: UInt32

    public var description: String { "\(loop).\(slot).\(generation)" }

    /// Packed into 64 bits for `DeviceRecord`; generations start at 1, so 0 means "none".
    var packed: UInt64 { UInt64(generation) << 32 | UInt64(slot & 0x00FF_FFFF) << 8 | UInt64(loop & 0xFF) }

    init(loop: UInt16, slot: UInt32, generation: UInt32) {
        precondition(loop < 256 && slot < 1 << 24 && generation != 0)
        self.loop = loop
        self.slot = slot
        self.generation = generation
    }

    init?(packed: UInt64) {
        guard packed != 0 else { return nil }
        loop = UInt16(packed & 0xFF)
        slot = UInt32((packed >> 8) & 0x00FF_FFFF)
        generation = UInt32(packed >> 32)
    }
}

/// Everything the server keeps for one device of one user: its session, its event queue,
/// how far that queue is durable, and where the device is connected (if anywhere).
///
/// Concurrency: every mutable field is guarded by the lock of the user's routing shard.
/// Event loops hold references to records (a connection knows its device) but read or
/// write them only inside `Switchboard.withState(of: userID)` (or `withDevices(of:)`); no
/// other shard ever reaches them (steps name devices by id). That is why the class can be
/// marked Sendable.
///
/// Memory: one of these exists per device, so it is kept to 120 bytes, which malloc serves
/// from a 128-byte block (checked by a test). Declaration order matters: Swift does not
/// pack a field into the padding of the one before, so the 8-byte fields come first. No
/// optionals that widen fields, times in 32-bit seconds, positions relative to `lastSeq`
/// in 32 bits, the per-connection write position kept by the connection instead.
final class DeviceRecord: @unchecked Sendable {
    let userID: String
    let deviceID: String
    /// The next device of the same user (a user's devices form a short linked list whose
    /// head is in `SwitchboardState.users`).
    var next: DeviceRecord?
    /// The current session; a resume must name it.
    var sessionID: SessionID
    /// The unacknowledged events. Appended to through `append`, which keeps `writableSeq`.
    private(set) var queue: EventQueue
    private var connectionBits: UInt64 = 0
    /// Seconds (switchboard timeline) when the device last lost its connection, or 0.
    var disconnectedSecond: UInt32 = 0
    /// `lastSeq - writableSeq`: at most the events appended since the last one made
    /// writable, so bounded by `--max-pending` and kept in 32 bits.
    private var unwritable: UInt32 = 0
    /// How many numbers after `lastSeq` the store has reserved for this device (committed
    /// `StoreChange.reserveSequence`s): the next event may go to the connected device
    /// before its own commit only while this is positive, because a restarted server never
    /// hands out reserved numbers again. Kept relative to `lastSeq` in 32 bits (a window
    /// is at most 65,536).
    var reservedAhead: UInt32 = 0
    /// The device's reservation window is `SwitchboardState.reservationWindow << this`: it
    /// grows each time events outrun the reservation (a device that receives thousands of
    /// events a second, such as a bot or a fan-out sender collecting receipts).
    var reservationScale: UInt8 = 0
    /// A wake-up for `connection` is already on its way; further events need none.
    var wakePending = false
    /// A reservation made when events outran the window is not committed yet: until it is,
    /// more events beyond the reservation do not grow the window again (else one burst
    /// would double it once per event, up to the maximum, and a crash would skip that many).
    var reservationGrowing = false
    /// Which of `SwitchboardState`'s expiry heaps hold an entry for this device (at most
    /// one each, however often the device reconnects; kept while it is online, since the
    /// entry stays in the heap until it comes due).
    var expiryEntries: ExpiryEntries = []

    struct ExpiryEntries: OptionSet {
        let rawValue: UInt8
        /// The session-expiry heap (session TTL).
        static let session = ExpiryEntries(rawValue: 1)
        /// The device-expiry heap (event TTL).
        static let device = ExpiryEntries(rawValue: 2)
    }

    init(userID: String, deviceID: String, sessionID: SessionID, nextSeq: UInt64 = 1) {
        self.userID = userID
        self.deviceID = deviceID
        self.sessionID = sessionID
        self.queue = EventQueue(nextSeq: nextSeq)
    }

    /// Every event ≤ this may be written to the device: it is committed to the store, or
    /// needs no commit, or was released to the live connection before its commit
    /// (`Delivery.immediate`). Never above `lastSeq`.
    var writableSeq: UInt64 {
        get { lastSeq - UInt64(unwritable) }
        set {
            precondition(newValue <= lastSeq, "writable beyond the last event")
            unwritable = UInt32(lastSeq - newValue)
        }
    }

    /// Queues `event` under the next number, not yet writable, and returns the number.
    func append(_ event: QueuedEvent) -> UInt64 {
        unwritable += 1
        return queue.append(event)
    }

    /// Takes the event numbered `seq` out of the queue, if it is there (`EventQueue.remove`).
    func withdraw(_ seq: UInt64) -> QueuedEvent? { queue.remove(seq) }

    /// Rebuilds the stored queue at start: `events` under their stored numbers, then the
    /// numbers handed out or reserved through `lastSeq`, which are never handed out again.
    /// Everything is writable (a restarted server has committed all it knows).
    func restore(_ events: some Sequence<(seq: UInt64, event: QueuedEvent)>, through lastSeq: UInt64) {
        for (seq, event) in events where seq > queue.lastSeq { queue.append(event, as: seq) }
        queue.skip(through: lastSeq)
        unwritable = 0
    }

    /// Hands `body` every queued event, in order.
    func forEachEvent(_ body: (QueuedEvent) -> Void) {
        queue.forEach(after: 0) { _, event in
            body(event)
            return true
        }
    }

    /// Drops the events numbered ≤ `seq` (acknowledged), the oldest first, at most `limit`
    /// of them, handing each to `body` first.
    func removeThrough(_ seq: UInt64, limit: Int = .max, _ body: (UInt64, QueuedEvent) -> Void) {
        queue.removeThrough(seq, limit: limit, body)
    }

    /// Everything ≤ this has been acknowledged by the device.
    var ackedSeq: UInt64 { queue.ackedSeq }
    var lastSeq: UInt64 { queue.lastSeq }

    /// The live connection, if any.
    var connection: ConnectionRef? {
        get { ConnectionRef(packed: connectionBits) }
        set { connectionBits = newValue?.packed ?? 0 }
    }

    var isOnline: Bool { connectionBits != 0 }
}

/// The parts of a user's state that only active users have: calls, messages held for a
/// user with no device yet, and recently sent message ids. Idle users have none, so this is
/// kept in its own dictionary instead of in a per-user object.
///
/// Guarded by the `Switchboard` lock.
final class UserActivity: @unchecked Sendable {
    /// Calls to this user that have not ended (they live in this user's shard).
    var calls: [CallRecord] = []
    /// Calls placed by this user's devices that have not ended (their state is in the
    /// callee's shard, perhaps another one).
    var outgoingCalls: [OutgoingCall] = []
    /// Messages for this user that arrived while the server knew none of its devices, in
    /// the order they arrived. A slice: a claim (`HeldClaim`) and the expiry take events
    /// from the front, each in O(1), not by moving every event behind them.
    var held: ArraySlice<QueuedEvent> = []
    /// Ordinal of `held.first` (the store orders held events by ordinal).
    var firstHeldOrdinal: UInt64 = 1
    /// messageId → server time, for de-duplicating this user's sends (up to a day of a
    /// sender's messages: a table that grows incrementally, `IncrementalDictionary`).
    var recentMessageIDs = IncrementalDictionary<String, UInt64>()
    /// messageId → a message of this user to another shard's user that this shard
    /// admitted and the recipient's shard has not decided yet (its id is claimed: a repeat
    /// meanwhile is neither a new message nor a duplicate).
    var undecidedMessages: [String: UndecidedMessage] = [:]
    /// The fan-out of a message to this user that is in progress (its shard's): other
    /// messages to the user wait for it (`FanOut`).
    var fanOut: FanOut?
    /// This user's messages whose copies to its other devices go a chunk per hold (`FanOut`,
    /// the sender's side), by id, until every copy is woken or withdrawn.
    var copies: [UInt64: FanOut] = [:]
    /// Those of `copies` still being queued, in the order they were sent: the first is in
    /// progress, the others wait for it (`SwitchboardState.copiesInChunks`).
    var syncing = FIFOQueue<FanOut>()
    /// A device of this user taking the held messages, a chunk per hold, in progress:
    /// other messages to the user wait for it (`HeldClaim`).
    var claim: HeldClaim?
    /// Events for many of this user's devices being queued a chunk per hold (a call's
    /// ending), the one in progress first, the others waiting for it in the order they were
    /// decided (`DeviceBroadcast`).
    var broadcasts = FIFOQueue<DeviceBroadcast>()
    /// Paces this user's messages and calls (`--sender-rate`; nil until the first one).
    var sendBucket: TokenBucket?

    var isEmpty: Bool {
        calls.isEmpty && outgoingCalls.isEmpty && held.isEmpty && recentMessageIDs.isEmpty && undecidedMessages.isEmpty
            && fanOut == nil && copies.isEmpty && claim == nil && broadcasts.isEmpty
    }

    /// Held messages, not counting the placeholders of ordinals a restart lost.
    var heldEventCount: Int { held.reduce(0) { $0 + ($1 === QueuedEvent.placeholder ? 0 : 1) } }

    /// Hands `body` every held event, in order.
    func forEachHeld(_ body: (QueuedEvent) -> Void) {
        for event in held { body(event) }
    }
    var nextHeldOrdinal: UInt64 { firstHeldOrdinal + UInt64(held.count) }
}

/// A message between its sender's shard and its recipient's: admitted by the sender's
/// shard, which queued its copies to the sender's other devices (`QueuedEvent.awaitsDecision`)
/// so that the recipient's shard's decision needs no room that may be gone by then.
struct UndecidedMessage {
    let serverTime: UInt64
    /// The copy queued to the sender's other devices (nil: the sender has no other device,
    /// or its copies go in chunks, `copies`).
    var copy: QueuedEvent? = nil
    /// Where the copy went: each device and the number it has there.
    var copiedTo: [(device: DeviceRecord, seq: UInt64)] = []
    /// The copies, when they go a chunk per hold (more than a chunk of devices, or other
    /// messages of the sender copied in chunks ahead of this one): they were all queued
    /// before the message went on to the recipient's shard.
    var copies: FanOut? = nil
    /// The store refused the message (its deadline passed) before the recipient's shard
    /// decided it (`cancelMessage`): settled as refused whatever that shard decides, so
    /// the id is not remembered for a message the sender was told is not accepted.
    var refusedByStore = false
}

/// A user's devices, newest first.
struct DeviceList: Sequence {
    let first: DeviceRecord?

    struct Iterator: IteratorProtocol {
        var current: DeviceRecord?
        mutating func next() -> DeviceRecord? {
            defer { current = current?.next }
            return current
        }
    }

    func makeIterator() -> Iterator { Iterator(current: first) }
}

extension DeviceList {
    /// The list without `device` (nil: the whole list), walked in place: a message's
    /// recipients but the sending device. `filter` made an array of them per message, an
    /// allocation and its free (callgrind, issue 16).
    func skipping(_ device: DeviceRecord?) -> DeviceListSkipping { DeviceListSkipping(list: self, skipped: device) }
}

/// `DeviceList.skipping(_:)`.
struct DeviceListSkipping: Sequence {
    let list: DeviceList
    let skipped: DeviceRecord?

    struct Iterator: IteratorProtocol {
        var base: DeviceList.Iterator
        let skipped: DeviceRecord?
        mutating func next() -> DeviceRecord? {
            while let device = base.next() {
                if device !== skipped { return device }
            }
            return nil
        }
    }

    func makeIterator() -> Iterator { Iterator(base: list.makeIterator(), skipped: skipped) }
}
