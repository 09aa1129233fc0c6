import SignalingProtocol
import SignalingSupport

/// Tunables of the routing core (a subset of `ServerConfiguration`).
struct SwitchboardConfiguration: Sendable {
    var maxPendingEvents = 10_000
    var sessionTTL: Duration = .seconds(86_400)
    var ringTimeout: Duration = .seconds(60)
    var callGrace: Duration = .seconds(10)
    var dedupWindow: Duration = .seconds(86_400)
    var dedupCapacity = 1_000_000
}

/// Something the event loops must do after the switchboard changed state.
enum SwitchboardEffect: Equatable, Sendable {
    /// New events are pending for the device behind this connection: write them.
    case wake(ConnectionRef)
    /// Close this connection with this CLOSE frame (another connection took over).
    case close(ConnectionRef, Close)
    /// An event was queued for a device with no live connection (push wake-up).
    case offlineEvent(user: String, device: String, type: FrameType)
}

/// What a successful handshake produced.
struct AttachGrant {
    let record: DeviceRecord
    let sessionID: SessionID
    let resumed: Bool
    let ackedSeq: UInt64
}

/// Counters exported as server statistics.
struct SwitchboardCounters: Sendable, Equatable {
    var eventsQueued = 0
    /// Call events and receipts that found a full queue (messages are refused instead).
    var eventsDropped = 0
    var sessionsExpired = 0
    /// Unacknowledged events thrown away with an expired session.
    var eventsExpired = 0
    var messagesAccepted = 0
    var messagesDeduplicated = 0
    var callsStarted = 0
}

/// The routing core: users, devices, sessions, queues and calls, as a pure state machine.
///
/// Every operation takes the current time as an argument and records what the event loops
/// must do as `effects` (take them with `takeEffects()`); nothing here does I/O or reads a
/// clock. The server keeps one instance behind the `Switchboard` lock; tests drive it
/// directly.
struct SwitchboardState {
    let configuration: SwitchboardConfiguration
    private(set) var users: [String: UserRecord] = [:]
    var calls: [String: CallRecord] = [:]
    var counters = SwitchboardCounters()
    private var effects: [SwitchboardEffect] = []

    // Deadlines. Each kind has a constant length, so each FIFO is in deadline order.
    private var sessionExpiry = FIFOQueue<(record: DeviceRecord, since: Instant)>()
    private var ringExpiry = FIFOQueue<(call: CallRecord, deadline: Instant)>()
    private var graceChecks = FIFOQueue<(call: CallRecord, record: DeviceRecord, since: Instant)>()
    private var dedupExpiry = FIFOQueue<(user: UserRecord, messageID: String, deadline: Instant)>()
    private var unclaimedExpiry = FIFOQueue<(user: UserRecord, event: QueuedEvent, deadline: Instant)>()

    /// Whether a device with no connection can be woken (a push gateway is configured).
    /// Decides whether a call to an offline callee fails at once or waits for it.
    var canWakeOfflineDevices = false

    init(configuration: SwitchboardConfiguration) {
        self.configuration = configuration
    }

    mutating func takeEffects() -> [SwitchboardEffect] {
        defer { effects = [] }
        return effects
    }

    // MARK: Handshake

    /// Binds a connection to its device after a HELLO: resumes the device's session or
    /// starts a new one, and evicts an older connection of the same device.
    mutating func attach(
        userID: String, deviceID: String, resume: ResumePoint?, connection: ConnectionRef, now: Instant
    ) -> Result<AttachGrant, ProtocolViolation> {
        let existingUser = users[userID]
        var record = existingUser?.device(deviceID)
        var resumed = false

        if let resume {
            guard let known = record, known.sessionID == resume.sessionID else {
                return .failure(ProtocolViolation(
                    .sessionUnknown, "session \(resume.sessionID) is unknown or expired; start a new session"))
            }
            guard resume.lastReceivedSeq <= known.maxSentSeq else {
                return .failure(ProtocolViolation(
                    .invalidSequence,
                    "resume point \(resume.lastReceivedSeq) is beyond the last event sent (\(known.maxSentSeq))"))
            }
            acknowledge(known, through: resume.lastReceivedSeq)
            known.sentSeq = max(known.ackedSeq, resume.lastReceivedSeq)
            resumed = true
        }

        let user = existingUser ?? createUser(userID)
        if let known = record, !resumed {
            known.sessionID = SessionID.random()
            known.sentSeq = known.ackedSeq
        } else if record == nil {
            let created = DeviceRecord(user: user, deviceID: deviceID, sessionID: SessionID.random())
            user.add(created)
            record = created
        }
        let device = record!

        if let old = device.connection, old != connection {
            effects.append(.close(old, Close(
                code: .replaced, message: "another connection of device \(deviceID) took over this session")))
        }
        device.connection = connection
        device.disconnectedAt = nil
        device.wakePending = true  // the loop writes pending events right after WELCOME

        // Messages that waited for this user's first device.
        if let activity = user.existingActivity {
            if !activity.unclaimed.isEmpty {
                for event in activity.unclaimed { enqueue(event, to: device) }
                activity.unclaimed = []
            }
            ringIfCalled(device, activity)
        }
        return .success(AttachGrant(record: device, sessionID: device.sessionID, resumed: resumed, ackedSeq: device.ackedSeq))
    }

    /// A callee device that connects while a call rings is rung too.
    private mutating func ringIfCalled(_ device: DeviceRecord, _ activity: UserActivity) {
        for call in activity.calls where call.callee == device.userID && call.state.isUnanswered {
            if !call.rungDevices.contains(where: { $0 === device }) {
                call.rungDevices.append(device)
                enqueue(call.invitation, to: device)
            }
        }
    }

    /// The connection is gone. The session stays resumable for `sessionTTL`; calls the
    /// device takes part in end unless it comes back within `callGrace`.
    mutating func detach(_ device: DeviceRecord, connection: ConnectionRef, now: Instant) {
        guard device.connection == connection else { return }  // already taken over
        device.connection = nil
        device.wakePending = false
        device.disconnectedAt = now
        sessionExpiry.push((device, now))
        for call in device.user.existingActivity?.calls ?? [] where call.isLive && involves(call, device) {
            graceChecks.push((call, device, now))
        }
    }

    // MARK: Delivery

    /// Queues `event` for `device` and wakes its connection. Returns false (and drops the
    /// event) when the device's queue is full; callers that must not lose an event check
    /// `hasRoom` first.
    @discardableResult
    mutating func enqueue(_ event: QueuedEvent, to device: DeviceRecord) -> Bool {
        guard device.queue.count < configuration.maxPendingEvents else {
            counters.eventsDropped += 1
            return false
        }
        _ = device.queue.append(event)
        counters.eventsQueued += 1
        if let connection = device.connection {
            if !device.wakePending {
                device.wakePending = true
                effects.append(.wake(connection))
            }
        } else {
            recordOfflineEvent(device, event.encoded.type)
        }
        return true
    }

    mutating func recordOfflineEvent(_ device: DeviceRecord, _ type: FrameType) {
        effects.append(.offlineEvent(user: device.userID, device: device.deviceID, type: type))
    }

    func hasRoom(_ device: DeviceRecord) -> Bool {
        device.queue.count < configuration.maxPendingEvents
    }

    /// The next events to write to `connection`, and the sequence number of the first.
    /// Nil when the connection no longer speaks for the device (it was taken over).
    mutating func nextBatch(for device: DeviceRecord, connection: ConnectionRef, limit: Int) -> (firstSeq: UInt64, events: ArraySlice<QueuedEvent>)? {
        guard device.connection == connection else { return nil }
        device.wakePending = false
        let events = device.queue.events(after: device.sentSeq, limit: limit)
        let first = device.sentSeq + 1
        device.sentSeq += UInt64(events.count)
        device.maxSentSeq = max(device.maxSentSeq, device.sentSeq)
        return (first, events)
    }

    /// A cumulative ACK from the device's live connection.
    mutating func ack(_ device: DeviceRecord, connection: ConnectionRef, through seq: UInt64) -> ProtocolViolation? {
        guard device.connection == connection else { return nil }  // a late ACK from an evicted connection
        guard seq <= device.maxSentSeq else {
            return ProtocolViolation(.invalidSequence, "ACK \(seq) is beyond the last event sent (\(device.maxSentSeq))")
        }
        acknowledge(device, through: seq)
        return nil
    }

    private mutating func acknowledge(_ device: DeviceRecord, through seq: UInt64) {
        guard seq > device.ackedSeq else { return }
        var receipts: [DeliveryReceipt] = []
        device.queue.removeThrough(seq) { _, event in
            if let receipt = event.receipt { receipts.append(receipt) }
        }
        device.ackedSeq = seq
        device.sentSeq = max(device.sentSeq, seq)
        guard !receipts.isEmpty else { return }
        for receipt in receipts {
            guard let sender = users[receipt.sender] else { continue }
            let delivered = QueuedEvent(.messageDelivered(
                messageID: receipt.messageID, recipient: receipt.recipient, recipientDevice: device.deviceID,
                serverTime: currentWall))
            for senderDevice in sender.devices { enqueue(delivered, to: senderDevice) }
        }
    }

    /// Wall-clock time of the operation in progress (set by the caller before each
    /// operation that stamps events).
    var currentWall: UInt64 = 0

    // MARK: Records

    private mutating func createUser(_ userID: String) -> UserRecord {
        let user = UserRecord(userID: userID)
        users[userID] = user
        return user
    }

    mutating func user(_ userID: String, create: Bool) -> UserRecord? {
        if let user = users[userID] { return user }
        return create ? createUser(userID) : nil
    }

    /// Drops a user record (or its activity part) that holds nothing any more.
    mutating func collectIfEmpty(_ user: UserRecord) {
        user.compactActivity()
        guard user.isEmpty, users[user.userID] === user else { return }
        users[user.userID] = nil
    }

    func involves(_ call: CallRecord, _ device: DeviceRecord) -> Bool {
        if call.caller === device { return true }
        guard call.callee == device.userID else { return false }
        switch call.state {
        case .inviting, .ringing: return call.rungDevices.contains { $0 === device }
        case .active(let answeredBy): return answeredBy == device.deviceID
        case .ended: return false
        }
    }

    // MARK: Deadlines

    mutating func scheduleRingTimeout(_ call: CallRecord, now: Instant) {
        ringExpiry.push((call, now + configuration.ringTimeout))
    }

    mutating func scheduleDedupExpiry(_ user: UserRecord, _ messageID: String, now: Instant) {
        dedupExpiry.push((user, messageID, now + configuration.dedupWindow))
        // Bound memory under a message flood: forget the oldest ids early.
        while dedupExpiry.count > configuration.dedupCapacity, let oldest = dedupExpiry.pop() {
            forgetMessageID(oldest.user, oldest.messageID)
        }
    }

    mutating func scheduleUnclaimedExpiry(_ user: UserRecord, _ event: QueuedEvent, now: Instant) {
        unclaimedExpiry.push((user, event, now + configuration.sessionTTL))
    }

    private mutating func forgetMessageID(_ user: UserRecord, _ messageID: String) {
        user.existingActivity?.recentMessageIDs[messageID] = nil
        collectIfEmpty(user)
    }

    /// Runs every deadline that has passed at `now`. Called by one event loop per tick.
    mutating func expire(now: Instant) {
        while let entry = ringExpiry.first, entry.deadline <= now {
            ringExpiry.pop()
            if entry.call.isLive && entry.call.state.isUnanswered { ringTimedOut(entry.call) }
        }
        while let entry = graceChecks.first, entry.since + configuration.callGrace <= now {
            graceChecks.pop()
            let device = entry.record
            if entry.call.isLive && !device.isOnline && device.disconnectedAt == entry.since {
                partyVanished(entry.call, device)
            }
        }
        while let entry = sessionExpiry.first, entry.since + configuration.sessionTTL <= now {
            sessionExpiry.pop()
            let device = entry.record
            guard !device.isOnline, device.disconnectedAt == entry.since else { continue }
            let user = device.user
            guard user.device(device.deviceID) === device else { continue }
            user.remove(device)
            counters.sessionsExpired += 1
            counters.eventsExpired += device.queue.count
            collectIfEmpty(user)
        }
        while let entry = dedupExpiry.first, entry.deadline <= now {
            dedupExpiry.pop()
            forgetMessageID(entry.user, entry.messageID)
        }
        while let entry = unclaimedExpiry.first, entry.deadline <= now {
            unclaimedExpiry.pop()
            if let activity = entry.user.existingActivity, activity.unclaimed.first === entry.event {
                counters.eventsExpired += 1
                activity.unclaimed.removeFirst()
                collectIfEmpty(entry.user)
            }
        }
    }
}
