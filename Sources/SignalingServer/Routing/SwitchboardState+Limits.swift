import SignalingProtocol
import SignalingSupport

/// A queue a sender's messages wait in: a device's, or the list held for a user with no
/// device yet.
enum ShareQueue: Hashable {
    case device(ObjectIdentifier)
    case held(String)
}

/// One sender's unacknowledged messages in one queue. The device is keyed by identity
/// (cheaper to hash than its ids, on a path every message and acknowledgement takes); an
/// entry is gone before its device record can be freed (`removeDevice` counts its queue
/// out), so an identity is never confused with a later record's.
struct SenderShareKey: Hashable {
    let queue: ShareQueue
    let sender: String
}

/// Bounds on what one client can make the server hold (docs/PROTOCOL.md 6.2): the
/// per-sender share of a recipient's queue, the per-sender rate, and the server's memory
/// budget. Each refusal is an ERROR with its own code, and nothing was accepted.
extension SwitchboardState {
    /// Puts reloaded limits in force (SIGHUP). Senders' buckets start afresh at a new rate;
    /// counts already held stay and are compared with the new limits from now on.
    mutating func applyLimits(of new: SwitchboardConfiguration) {
        if new.senderRate != configuration.senderRate {
            for activity in activities.values { activity.sendBucket = nil }
        }
        configuration.maxPendingEvents = new.maxPendingEvents
        configuration.maxPendingPerSender = new.maxPendingPerSender
        configuration.senderRate = new.senderRate
        configuration.memoryBudget = new.memoryBudget
    }

    /// Builds an event stamped with the current time, counted in the memory ledger.
    func makeEvent(_ event: Event, receipt: DeliveryReceipt? = nil) -> QueuedEvent {
        QueuedEvent(event, receipt: receipt, createdAt: currentWall, ledger: ledger)
    }

    /// The memory budget and the sender's rate, checked before a message or a call that
    /// carries `bytes` of content is accepted.
    mutating func admitSender(_ userID: String, bytes: Int, now: Instant) -> RequestError? {
        let held = ledger.bytes
        if held + bytes > configuration.memoryBudget {
            counters.refusedCapacity += 1
            return RequestError(
                .capacityExceeded,
                "the server holds as much undelivered data as it may (\(held) of \(configuration.memoryBudget) bytes); retry later")
        }
        guard configuration.senderRate > 0 else { return nil }
        let activity = activity(userID)
        if activity.sendBucket == nil {
            let rate = Double(configuration.senderRate)
            activity.sendBucket = TokenBucket(rate: rate, burst: 2 * rate, now: now)
        }
        guard activity.sendBucket!.tryTake(now: now) else {
            counters.refusedRate += 1
            return RequestError(
                .rateLimited, "\(userID) sends more than \(configuration.senderRate) messages and calls a second; retry later")
        }
        return nil
    }

    /// Refuses a message when its sender already has its share of any target's queue
    /// (`devices` empty: the list held for a recipient with no device yet).
    func checkSenderShare(_ sender: String, recipient: String, devices: [DeviceRecord]) -> RequestError? {
        let limit = configuration.maxPendingPerSender
        let queues: [(ShareQueue, String)] = devices.isEmpty
            ? [(.held(recipient), "")] : devices.map { (.device(ObjectIdentifier($0)), " (device \($0.deviceID))") }
        for (queue, which) in queues where (pendingBySender[SenderShareKey(queue: queue, sender: sender)] ?? 0) >= limit {
            return RequestError(
                .senderQuotaExceeded,
                "\(sender) already has \(limit) unacknowledged messages waiting for \(recipient)\(which); retry later")
        }
        return nil
    }

    /// Counts a message (an event with a receipt) in or out of its sender's share.
    /// Every event entering or leaving a device queue or a user's held list passes here,
    /// so it also keeps `counters.pendingEvents`.
    mutating func countShare(of event: QueuedEvent, in queue: ShareQueue, by delta: Int) {
        if event !== QueuedEvent.placeholder { counters.pendingEvents += delta }
        guard let receipt = event.receipt else { return }
        let key = SenderShareKey(queue: queue, sender: receipt.sender)
        let count = (pendingBySender[key] ?? 0) + delta
        pendingBySender[key] = count > 0 ? count : nil
    }
}
