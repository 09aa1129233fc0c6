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

/// Everything the server keeps for one device of one user: its session, its event
/// sequence, its unacknowledged events, and where it is connected (if anywhere).
///
/// Concurrency: every mutable field is guarded by the `Switchboard` lock. Event loops hold
/// references to records (a connection knows its device) but read or write them only
/// inside `Switchboard.withState`. That is why the class can be marked Sendable.
///
/// Memory: one of these exists per device, connected or not, so it is kept small (no
/// optionals that widen fields, the user's id shared through `user`).
final class DeviceRecord: @unchecked Sendable {
    /// The owning user. Unowned: a user record is dropped only once it has no devices.
    unowned(unsafe) let user: UserRecord
    let deviceID: String
    /// The next device of the same user (a user's devices form a short linked list).
    var next: DeviceRecord?
    /// The current session; a resume must name it.
    var sessionID: SessionID
    var queue: EventQueue
    /// Everything ≤ this has been acknowledged by the device.
    var ackedSeq: UInt64
    /// Highest sequence number written to the current connection.
    var sentSeq: UInt64
    /// Highest sequence number ever written to any connection of this device; a resume
    /// point or ACK beyond it is impossible and refused.
    var maxSentSeq: UInt64
    private var connectionBits: UInt64 = 0
    private var disconnectedNanos: UInt64 = .max
    /// A wake-up for `connection` is already on its way; further events need none.
    var wakePending = false

    init(user: UserRecord, deviceID: String, sessionID: SessionID, nextSeq: UInt64 = 1) {
        self.user = user
        self.deviceID = deviceID
        self.sessionID = sessionID
        self.queue = EventQueue(nextSeq: nextSeq)
        self.ackedSeq = nextSeq - 1
        self.sentSeq = nextSeq - 1
        self.maxSentSeq = nextSeq - 1
    }

    var userID: String { user.userID }

    /// The live connection, if any.
    var connection: ConnectionRef? {
        get { ConnectionRef(packed: connectionBits) }
        set { connectionBits = newValue?.packed ?? 0 }
    }

    var isOnline: Bool { connectionBits != 0 }

    /// When the device last lost its connection (for session expiry and call grace).
    var disconnectedAt: Instant? {
        get { disconnectedNanos == .max ? nil : Instant(nanoseconds: disconnectedNanos) }
        set { disconnectedNanos = newValue?.nanoseconds ?? .max }
    }
}

/// A user: its devices and, only when needed, its calls, held messages and recent message
/// ids (`UserActivity`), so an idle single-device user costs two small objects.
///
/// Guarded by the `Switchboard` lock, like `DeviceRecord`.
final class UserRecord: @unchecked Sendable {
    let userID: String
    private(set) var firstDevice: DeviceRecord?
    private var activityStorage: UserActivity?

    init(userID: String) { self.userID = userID }

    var devices: DeviceList { DeviceList(first: firstDevice) }
    var hasDevices: Bool { firstDevice != nil }

    func device(_ deviceID: String) -> DeviceRecord? {
        devices.first { $0.deviceID == deviceID }
    }

    func add(_ device: DeviceRecord) {
        device.next = firstDevice
        firstDevice = device
    }

    func remove(_ device: DeviceRecord) {
        if firstDevice === device {
            firstDevice = device.next
        } else {
            var current = firstDevice
            while let candidate = current, candidate.next !== device { current = candidate.next }
            current?.next = device.next
        }
        device.next = nil
    }

    var onlineDevices: [DeviceRecord] { devices.filter(\.isOnline) }

    /// Calls, held messages and recent message ids; created on first use.
    var activity: UserActivity {
        if let activityStorage { return activityStorage }
        let created = UserActivity()
        activityStorage = created
        return created
    }

    /// The activity record if it exists (reading without creating one).
    var existingActivity: UserActivity? { activityStorage }

    /// Drops the activity record once it holds nothing.
    func compactActivity() {
        if let activityStorage, activityStorage.isEmpty { self.activityStorage = nil }
    }

    var isEmpty: Bool { firstDevice == nil && (activityStorage?.isEmpty ?? true) }
}

/// The parts of a user's state that only active users have.
final class UserActivity: @unchecked Sendable {
    /// Calls this user is a party to (as caller or callee) that have not ended.
    var calls: [CallRecord] = []
    /// Messages for this user that arrived while the server knew none of its devices.
    var unclaimed: [QueuedEvent] = []
    /// messageId → server time, for de-duplicating this user's sends.
    var recentMessageIDs: [String: UInt64] = [:]

    var isEmpty: Bool { calls.isEmpty && unclaimed.isEmpty && recentMessageIDs.isEmpty }
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
