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
        retrackShares()
    }

    /// Builds an event stamped with the current time, counted in the memory ledger (every
    /// event that carries content or ends a call; receipts are not counted).
    func makeEvent(_ event: Event, receipt: DeliveryReceipt? = nil) -> QueuedEvent {
        QueuedEvent(event, receipt: receipt, createdAt: currentWall, ledger: ledger, createdNanos: currentNanos)
    }

    /// The bytes the server's events hold, for a check against the memory budget of
    /// `bytes` more: this shard's exact count plus the others' as they published it
    /// (`MemoryTotal`, each at most a step behind), unless that is within the other shards'
    /// steps of the budget: then every shard's exact count, read once each (as exact as one
    /// counter shared by every shard, which every loop wrote per event).
    func heldBytes(adding bytes: Int = 0) -> Int {
        let own = ledger.bytes
        let approximate = own + ledger.total.bytes - ledger.publishedBytes
        let slack = (shardLedgers.count - 1) * MemoryTotal.publishStep
        guard approximate + bytes + slack > configuration.memoryBudget else { return approximate }
        return shardLedgers.reduce(0) { $0 + $1.bytes }
    }

    /// The memory budget and the sender's rate, checked before a message or a call that
    /// carries `bytes` of content is accepted.
    mutating func admitSender(_ userID: String, bytes: Int, now: Instant) -> RequestError? {
        let held = heldBytes(adding: bytes)
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
    ///
    /// Costs nothing per target on the usual path (a fan-out checks every device): a queue
    /// shorter than the share cannot hold a share's worth from anyone.
    func checkSenderShare(_ sender: String, recipient: String, devices: some Sequence<DeviceRecord>) -> RequestError? {
        let limit = configuration.maxPendingPerSender
        func full(_ queue: ShareQueue) -> Bool {
            (pendingBySender[SenderShareKey(queue: queue, sender: sender)] ?? 0) >= limit
        }
        func refusal(_ which: String) -> RequestError {
            RequestError(.senderQuotaExceeded, "\(sender) already has \(limit) unacknowledged messages waiting for \(recipient)\(which); retry later")
        }
        // Only a queue at least `limit` long can hold that many from one sender; it is
        // tracked (`shareFloor` is at most `limit`).
        var hasDevices = false
        for device in devices {
            hasDevices = true
            if device.queue.count >= limit && full(.device(ObjectIdentifier(device))) {
                return refusal(" (device \(device.deviceID))")
            }
        }
        if !hasDevices {
            let held = activities[recipient]?.held.count ?? 0
            return held >= limit && full(.held(recipient)) ? refusal("") : nil
        }
        return nil
    }

    // MARK: Share bookkeeping
    //
    // A queue's per-sender counts are kept (`pendingBySender`, the queue in
    // `trackedShareQueues`) only from the moment it holds `shareFloor` events until it falls
    // under half of that: a queue shorter than the share cannot hold a share's worth from
    // anyone, so the usual queue, a few events long, costs nothing per message, where
    // counting every one cost a dictionary update per event (a fan-out enqueues thousands).
    // Invariant: an untracked queue has no entries; a tracked one has exact counts.

    /// How long a queue gets before its shares are counted.
    var shareFloor: Int { max(1, configuration.maxPendingPerSender / 2) }

    /// Whether `queue`, holding `count` events, has its shares counted (queues under half
    /// the floor never do: no lookup).
    func sharesTracked(_ queue: ShareQueue, count: Int) -> Bool {
        count >= shareFloor / 2 && trackedShareQueues.contains(queue)
    }

    /// `event` was added to `queue`, which now holds `count` events (`events` enumerates
    /// them all, for a queue that starts being tracked). Always inlined: it runs for every
    /// event queued, and usually returns at once (an untracked queue); called, it cost
    /// about 40 instructions per event of a fan-out (callgrind, issue 16).
    @inline(__always)
    mutating func shareAdded(
        _ event: QueuedEvent, to queue: ShareQueue, count: Int, events: ((QueuedEvent) -> Void) -> Void
    ) {
        guard event.receipt != nil else { return }
        if sharesTracked(queue, count: count) {
            countShare(of: event, in: queue, by: 1)
        } else if count >= shareFloor {
            trackedShareQueues.insert(queue)
            events { countShare(of: $0, in: queue, by: 1) }
        }
    }

    /// `removed` left `queue`, which was tracked and now holds `count` events (`events`
    /// enumerates what is left).
    mutating func trackedSharesRemoved(
        _ removed: [QueuedEvent], from queue: ShareQueue, count: Int, events: ((QueuedEvent) -> Void) -> Void
    ) {
        for event in removed { countShare(of: event, in: queue, by: -1) }
        if count < shareFloor / 2 { stopTrackingShares(of: queue, events: events) }
    }

    /// The queue is gone or no longer tracked: its entries go.
    mutating func stopTrackingShares(of queue: ShareQueue, events: ((QueuedEvent) -> Void) -> Void) {
        guard trackedShareQueues.remove(queue) != nil else { return }
        events { event in
            if let receipt = event.receipt { pendingBySender[SenderShareKey(queue: queue, sender: receipt.sender)] = nil }
        }
    }

    /// Starts the bookkeeping afresh for every queue (after a load, or new limits).
    mutating func retrackShares() {
        pendingBySender = IncrementalDictionary()
        trackedShareQueues = []
        for head in users.heads {
            for device in DeviceList(first: head) where device.queue.count >= shareFloor {
                let queue = ShareQueue.device(ObjectIdentifier(device))
                trackedShareQueues.insert(queue)
                device.queue.forEach(after: 0) { _, event in
                    countShare(of: event, in: queue, by: 1)
                    return true
                }
            }
        }
        for (userID, activity) in activities where activity.held.count >= shareFloor {
            trackedShareQueues.insert(.held(userID))
            for event in activity.held { countShare(of: event, in: .held(userID), by: 1) }
        }
    }

    /// Counts a message (an event with a receipt) in or out of its sender's share.
    private mutating func countShare(of event: QueuedEvent, in queue: ShareQueue, by delta: Int) {
        guard let receipt = event.receipt else { return }
        let key = SenderShareKey(queue: queue, sender: receipt.sender)
        let count = (pendingBySender[key] ?? 0) + delta
        pendingBySender[key] = count > 0 ? count : nil
    }
}
