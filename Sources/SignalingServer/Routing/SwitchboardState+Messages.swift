import SignalingProtocol
import SignalingSupport

/// Message routing (docs/PROTOCOL.md 6.2): de-duplication, all-or-nothing fan-out,
/// per-user holding for users with no known device.
extension SwitchboardState {
    /// Accepts a message and queues it to the recipient's devices. On success returns the
    /// server timestamp to put in OK (the original one for a duplicate).
    mutating func send(_ message: OutgoingMessage, from device: DeviceRecord, now: Instant) -> Result<UInt64, RequestError> {
        let sender = device.user
        if let original = sender.existingActivity?.recentMessageIDs[message.messageID] {
            counters.messagesDeduplicated += 1
            return .success(original)
        }
        let recipient = users[message.recipient]
        let targets = (recipient?.devices ?? DeviceList(first: nil)).filter { $0 !== device }
        let holdForUser = !(recipient?.hasDevices ?? false)
        // All or nothing: a message is either queued to every target or refused.
        if let full = targets.first(where: { !hasRoom($0) }) {
            return .failure(RequestError(
                .recipientBacklogFull,
                "device \(full.deviceID) of \(message.recipient) has \(full.queue.count) unacknowledged events; retry later"))
        }
        if holdForUser, (recipient?.existingActivity?.unclaimed.count ?? 0) >= configuration.maxPendingEvents {
            return .failure(RequestError(
                .recipientBacklogFull, "\(message.recipient) has too many messages waiting for a first device; retry later"))
        }

        let serverTime = currentWall
        let event = QueuedEvent(
            .message(DeliveredMessage(
                messageID: message.messageID, sender: device.userID, senderDevice: device.deviceID,
                recipient: message.recipient, contentType: message.contentType, body: message.body,
                serverTime: serverTime)),
            receipt: DeliveryReceipt(sender: device.userID, messageID: message.messageID, recipient: message.recipient))
        if holdForUser {
            let holder = user(message.recipient, create: true)!
            holder.activity.unclaimed.append(event)
            scheduleUnclaimedExpiry(holder, event, now: now)
        } else {
            for target in targets { enqueue(event, to: target) }
        }
        sender.activity.recentMessageIDs[message.messageID] = serverTime
        scheduleDedupExpiry(sender, message.messageID, now: now)
        counters.messagesAccepted += 1
        return .success(serverTime)
    }
}
