import SignalingProtocol
import SignalingPush
import Synchronization

/// One event as queued to one or more devices: encoded once and shared by every queue it
/// was fanned out to.
///
/// The mutable parts (`isCancelled`, the flags, and the body, which may be evicted to the
/// store) are guarded by the lock of the routing shard that made it (hence `@unchecked
/// Sendable`; a message to another shard's user gets an event of its own there): a message
/// whose commit to the store failed is cancelled in every queue at once, and the pump
/// skips it.
final class QueuedEvent: @unchecked Sendable {
    /// The event as written after its sequence number. While the body is evicted
    /// (`isResident` false) this holds the type and an empty body.
    private(set) var encoded: EncodedEvent
    /// Where this event's memory is counted (nil: not counted, as for the placeholder).
    private let ledger: MemoryLedger?
    /// For MESSAGE events: what to report to the sender when a device acknowledges it.
    let receipt: DeliveryReceipt?
    /// Wall-clock creation time (ms), for storage.
    let createdAt: UInt64
    /// Monotonic creation instant (ns, `LoopMetrics.now()`), for the push latency
    /// histogram; 0 for an event loaded from the store (created by another process).
    let createdNanos: UInt64
    /// Never written to a device: its message was refused after all (store failure), or it
    /// fills an ordinal of a user's held messages that a restarted server no longer has.
    var isCancelled = false
    /// Held for a user with no device, then handed to that user's first device: the copy
    /// was journaled in the handshake's commit unit, not in its message's.
    var wasClaimed = false
    /// A message not decided yet, queued already: a copy to the sender's other devices of a
    /// message whose recipient's shard has not decided it (`SwitchboardState.settleMessage`),
    /// or the recipient's copy of a fan-out still in progress (`FanOut`). It holds its place
    /// in each device's order and its room in each queue, but the pump stops before it (a
    /// device's events go out in order) until the decision clears this flag or cancels the
    /// event.
    var awaitsDecision = false
    /// Committed to the store: its body may be dropped from memory and read back.
    var isDurable = false
    /// The body is in memory (else only in the store: `evictBody`, `restoreBody`).
    private(set) var isResident = true
    /// Queued for a device with no connection, or held for a user with no device: its
    /// write measures how long the device was away, not the server, so the push latency
    /// histogram leaves it out (`LoopMetrics.recordWrite`).
    var waitedForDevice = false

    /// `createdNanos`: the routing core passes its hold's start (`SwitchboardState.currentNanos`),
    /// which its hold read anyway, instead of a clock read per event.
    convenience init(
        _ event: Event, receipt: DeliveryReceipt? = nil, createdAt: UInt64, ledger: MemoryLedger? = nil,
        createdNanos: UInt64 = LoopMetrics.now()
    ) {
        self.init(encoded: EncodedEvent(event), receipt: receipt, createdAt: createdAt, ledger: ledger, createdNanos: createdNanos)
    }

    init(
        encoded: EncodedEvent, receipt: DeliveryReceipt?, createdAt: UInt64, ledger: MemoryLedger? = nil,
        createdNanos: UInt64 = LoopMetrics.now()
    ) {
        self.encoded = encoded
        self.createdNanos = createdNanos
        self.receipt = receipt
        self.createdAt = createdAt
        self.ledger = ledger
        ledger?.add(Self.footprint(of: encoded))
    }

    deinit {
        ledger?.add(-Self.footprint(of: encoded))
    }

    /// Whether this event's memory is counted in a ledger (a delivery receipt's is not).
    var isCounted: Bool { ledger != nil }

    /// Drops the body from memory; the store has it (`isDurable`).
    func evictBody() {
        guard isResident else { return }
        ledger?.add(-encoded.body.count)
        encoded = EncodedEvent(type: encoded.type, body: [])
        isResident = false
    }

    /// Puts back a body read from the store.
    func restoreBody(_ body: [UInt8]) {
        guard !isResident else { return }
        encoded = EncodedEvent(type: encoded.type, body: body)
        ledger?.add(body.count)
        isResident = true
    }

    /// What one event costs in memory, near enough for a budget: its body, plus the
    /// object, the body's array header and a receipt's strings.
    static func footprint(of encoded: EncodedEvent) -> Int { encoded.body.count + 160 }

    /// A cancelled event that only occupies an ordinal among a user's held messages. One
    /// instance serves every list (each hole costs a pointer, no object). Device queues
    /// need none: their holes cost nothing (`EventQueue`).
    static let placeholder: QueuedEvent = {
        let event = QueuedEvent(encoded: EncodedEvent(type: .callRang, body: []), receipt: nil, createdAt: 0)
        event.isCancelled = true
        return event
    }()
}

extension QueuedEvent {
    /// What a push wake-up for this event says it is about.
    var wakeUpKind: WakeUpKind {
        switch encoded.type {
        case .callIncoming: return .call
        case .message: return .message
        case .messageDelivered: return .receipt
        case .callEnded:
            // Only an unanswered call is a missed call; the reason byte follows the call id.
            let body = encoded.body
            guard body.count >= 2 else { return .other }
            let reasonOffset = 2 + (Int(body[0]) << 8 | Int(body[1]))
            guard reasonOffset < body.count, let reason = CallEndReason(rawValue: body[reasonOffset]) else { return .other }
            return reason == .noAnswer || reason == .cancelled || reason == .peerDisconnected ? .missedCall : .other
        default: return .other
        }
    }
}

/// The memory held by the events of one routing shard, counted as they are created and
/// freed (an event fanned out to many devices counts once), exactly. What
/// `--memory-budget` limits, summed over the shards: past it the server refuses new
/// messages and calls (ERROR capacityExceeded) rather than grow.
///
/// One per shard, not one for the server: every event's creation and end is an atomic add
/// here, and with one counter every loop would write the same cache line for every event,
/// the line moving between cores each time (issue 16: counters per loop, summed when
/// read). The shard's own loop makes nearly all of the adds; events freed on another
/// thread (the store writer dropping a commit unit's last reference) are the atomic's
/// reason. Each time the count has moved by `MemoryTotal.publishStep` since it was last
/// published, the add that moved it publishes it to the server's `MemoryTotal`, so that
/// total is written once per 64 KiB a shard's events grow or shrink, not per event.
/// Padded so that two shards' counters never share a 64-byte line.
final class MemoryLedger: Sendable {
    private let counted = Atomic<Int>(0)
    /// The count as last added to `total`.
    private let published = Atomic<Int>(0)
    /// Keeps other objects' fields off these counters' cache line (the object is 80 bytes:
    /// header 16, counters 16, padding 48).
    private let padding: (Int, Int, Int, Int, Int, Int) = (0, 0, 0, 0, 0, 0)
    /// The server's total, which every shard's ledger publishes to.
    let total: MemoryTotal

    init(total: MemoryTotal = MemoryTotal()) {
        self.total = total
    }

    /// Bytes held by this shard's live events.
    var bytes: Int { counted.load(ordering: .relaxed) }

    /// This shard's count as the other shards see it in `total`.
    var publishedBytes: Int { published.load(ordering: .relaxed) }

    func add(_ bytes: Int) {
        let now = counted.add(bytes, ordering: .relaxed).newValue
        guard abs(now - published.load(ordering: .relaxed)) >= MemoryTotal.publishStep else { return }
        // An exchange, not a store: two threads crossing a step at once each add only what
        // the other has not, so `total` stays the sum of every ledger's `published`.
        let before = published.exchange(now, ordering: .relaxed)
        total.add(now - before)
    }
}

/// Every shard's event memory as the shards last published it (`MemoryLedger`): each
/// shard's share at most `publishStep` away from its exact count. The memory budget's
/// check adds it to its own shard's exact count (`SwitchboardState.heldBytes`), and adds
/// up the shards' exact counts only when that is within the shards' steps of the budget,
/// so the budget is as exact as with one shared counter. Written once per 64 KiB a
/// shard's events grow or shrink.
final class MemoryTotal: Sendable {
    private let published = Atomic<Int>(0)

    /// How far a shard's count may move before it publishes it.
    static let publishStep = 64 << 10

    var bytes: Int { published.load(ordering: .relaxed) }

    func add(_ bytes: Int) {
        published.add(bytes, ordering: .relaxed)
    }
}

/// Who wants to know that a message reached a device.
///
/// Memory: kept in the message's `QueuedEvent` (one per message, shared by its devices'
/// queues); with `senderShard` the event still fits a 128-byte heap block
/// (checked by a test).
struct DeliveryReceipt: Sendable, Equatable {
    let sender: String
    let messageID: String
    let recipient: String
    /// The shard of `sender` (`ShardMap.shard(of:count:)`): where the receipt goes. Hashed
    /// once, when the message's event is made, not again by the acknowledgement of each
    /// device it reached (an id hashed per receipt was a tenth of what crossing shards
    /// added per event: docs/LOAD-TESTING.md, "Routing on more cores"). In memory only:
    /// a receipt loaded from a store is placed by the shard count of the process that
    /// loads it.
    let senderShard: UInt16
}

extension DeliveryReceipt {
    /// The receipt of a message of `sender`, placed among `shards`.
    init(sender: String, messageID: String, recipient: String, shards: ShardMap) {
        self.init(
            sender: sender, messageID: messageID, recipient: recipient,
            senderShard: UInt16(ShardMap.shard(of: sender, count: shards.count)))
    }
}
