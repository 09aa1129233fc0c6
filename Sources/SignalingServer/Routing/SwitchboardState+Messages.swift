import SignalingProtocol
import SignalingSupport

/// The outcome of a MESSAGE_SEND that was not refused.
struct MessageAcceptance {
    /// The server timestamp for OK (the original one for a duplicate).
    let serverTime: UInt64
    /// The queued event (nil for a duplicate): cancelled if its commit fails.
    let event: QueuedEvent?
}

/// Message routing (docs/PROTOCOL.md 6.2): de-duplication, all-or-nothing fan-out,
/// holding for users with no known device.
extension SwitchboardState {
    /// Accepts a message from a device and queues it to the recipient's devices and to the
    /// sender's other devices.
    mutating func send(_ message: OutgoingMessage, from device: DeviceRecord, now: Instant) -> Result<MessageAcceptance, RequestError> {
        send(message, sender: device.userID, senderDevice: device.deviceID, sendingDevice: device, now: now)
    }

    /// Accepts a message from `sender` (a device of it, `sendingDevice`, or a system sender
    /// of the admin API with none) and queues it to the recipient's devices and, for
    /// multi-device sync, to the sender's devices other than the sending one: every device
    /// of a user sees the messages the user sent. All of them share one event, so a
    /// cancelled message is cancelled everywhere; only the recipient's acknowledgements
    /// produce receipts (`acknowledge`).
    mutating func send(
        _ message: OutgoingMessage, sender: String, senderDevice: String, sendingDevice: DeviceRecord?, now: Instant
    ) -> Result<MessageAcceptance, RequestError> {
        let senderActivity = activities[sender]
        if let original = senderActivity?.recentMessageIDs[message.messageID] {
            counters.messagesDeduplicated += 1
            return .success(MessageAcceptance(serverTime: original, event: nil))
        }
        if let refusal = admitSender(sender, bytes: message.body.count, now: now) { return .failure(refusal) }
        let recipients = Array(devices(of: message.recipient))
        let targets = recipients.filter { $0 !== sendingDevice }
        let holdForUser = recipients.isEmpty
        // A note to oneself already reaches the sender's other devices as the recipient's.
        let copies = message.recipient == sender ? [] : devices(of: sender).filter { $0 !== sendingDevice }
        // All or nothing: a message is either queued to every target or refused.
        if let full = (targets + copies).first(where: { !hasRoom($0) }) {
            return .failure(RequestError(
                .recipientBacklogFull,
                "device \(full.deviceID) of \(message.recipient) has \(full.queue.count) unacknowledged events; retry later"))
        }
        if holdForUser, (activities[message.recipient]?.held.count ?? 0) >= configuration.maxPendingEvents {
            return .failure(RequestError(
                .recipientBacklogFull, "\(message.recipient) has too many messages waiting for a first device; retry later"))
        }
        // A full queue first (the recipient's state), then this sender's share of it.
        if let refusal = checkSenderShare(sender, recipient: message.recipient, devices: targets) {
            counters.refusedSenderQuota += 1
            return .failure(refusal)
        }

        let serverTime = currentWall
        let event = makeEvent(
            .message(DeliveredMessage(
                messageID: message.messageID, sender: sender, senderDevice: senderDevice,
                recipient: message.recipient, contentType: message.contentType, body: message.body,
                serverTime: serverTime)),
            receipt: DeliveryReceipt(sender: sender, messageID: message.messageID, recipient: message.recipient))
        if holdForUser {
            hold(event, for: message.recipient, now: now)
        } else {
            for target in targets { enqueue(event, to: target) }
        }
        for copy in copies { enqueue(event, to: copy) }
        rememberMessageID(
            message.messageID, sender: sender, serverTime: serverTime, now: now,
            in: senderActivity ?? activity(sender))
        counters.messagesAccepted += 1
        return .success(MessageAcceptance(serverTime: serverTime, event: event))
    }

    /// The store could not commit an accepted message in time: it was refused after all.
    /// Its event is never written to anyone, and the sender may send it again.
    mutating func cancelMessage(_ event: QueuedEvent, sender: String, messageID: String) {
        guard !event.isCancelled else { return }
        event.isCancelled = true
        activities[sender]?.recentMessageIDs[messageID] = nil
        compactActivity(sender)
        // A message held for a user with no device may have been claimed by that user's
        // first device meanwhile: that copy was journaled with the handshake, in another
        // commit unit, which may be committed although this message is refused. Withdraw
        // it. (Copies journaled with the message itself go, or are undone, with its unit.)
        if journaling && event.wasClaimed, let recipient = event.receipt?.recipient {
            for device in devices(of: recipient) {
                device.queue.forEach(after: device.ackedSeq) { seq, queued in
                    guard queued === event else { return true }
                    journal(.withdrawEvent(user: device.userID, device: device.deviceID, seq: seq))
                    return false
                }
            }
        }
        counters.messagesCancelled += 1
        counters.messagesAccepted -= 1
    }
}
