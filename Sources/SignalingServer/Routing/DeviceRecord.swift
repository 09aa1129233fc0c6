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
/// Concurrency: every mutable field is guarded by the `Switchboard` lock. Event loops hold
/// references to records (a connection knows its device) but read or write them only
/// inside `Switchboard.withState`. That is why the class can be marked Sendable.
///
/// Memory: one of these exists per device, so it is kept to 119 bytes (with malloc's
/// 8-byte header, a 128-byte heap block; declaration order matters for the padding): no optionals that widen fields, times in 32-bit seconds, the per-connection
/// write position kept by the connection instead.
final class DeviceRecord: @unchecked Sendable {
    let userID: String
    let deviceID: String
    /// The next device of the same user (a user's devices form a short linked list whose
    /// head is in `SwitchboardState.users`).
    var next: DeviceRecord?
    /// The current session; a resume must name it.
    var sessionID: SessionID
    var queue: EventQueue
    /// Seconds (switchboard timeline) when the device last lost its connection, or 0.
    var disconnectedSecond: UInt32 = 0
    /// Every event ≤ this may be written to the device: it is committed to the store, or
    /// needs no commit, or was released to the live connection before its commit
    /// (`Delivery.immediate`).
    var writableSeq: UInt64
    private var connectionBits: UInt64 = 0
    /// How many numbers after `lastSeq` the store has reserved for this device (committed
    /// `StoreChange.reserveSequence`s): the next event may go to the connected device
    /// before its own commit only while this is positive, because a restarted server never
    /// hands out reserved numbers again. Kept relative to `lastSeq` in 32 bits (a window
    /// is at most 65,536) so that the record stays in its heap block.
    var reservedAhead: UInt32 = 0
    /// The device's reservation window is `SwitchboardState.reservationWindow << this`: it
    /// grows each time events outrun the reservation (a device that receives thousands of
    /// events a second, such as a bot or a fan-out sender collecting receipts).
    var reservationScale: UInt8 = 0
    /// A wake-up for `connection` is already on its way; further events need none.
    var wakePending = false
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
        self.writableSeq = nextSeq - 1
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
    /// Calls this user is a party to (as caller or callee) that have not ended.
    var calls: [CallRecord] = []
    /// Messages for this user that arrived while the server knew none of its devices.
    var held: [QueuedEvent] = []
    /// Ordinal of `held.first` (the store orders held events by ordinal).
    var firstHeldOrdinal: UInt64 = 1
    /// messageId → server time, for de-duplicating this user's sends.
    var recentMessageIDs: [String: UInt64] = [:]

    var isEmpty: Bool { calls.isEmpty && held.isEmpty && recentMessageIDs.isEmpty }
    var nextHeldOrdinal: UInt64 { firstHeldOrdinal + UInt64(held.count) }
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
