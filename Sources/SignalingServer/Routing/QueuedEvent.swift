import SignalingProtocol

/// One event as queued to one or more devices: encoded once, shared by every mailbox it
/// was fanned out to, immutable (so it may cross threads freely).
final class QueuedEvent: Sendable {
    let encoded: EncodedEvent
    /// For MESSAGE events: what to report to the sender when a device acknowledges it.
    let receipt: DeliveryReceipt?

    init(_ event: Event, receipt: DeliveryReceipt? = nil) {
        self.encoded = EncodedEvent(event)
        self.receipt = receipt
    }

    init(encoded: EncodedEvent, receipt: DeliveryReceipt?) {
        self.encoded = encoded
        self.receipt = receipt
    }
}

/// Who wants to know that a message reached a device.
struct DeliveryReceipt: Sendable {
    let sender: String
    let messageID: String
    let recipient: String
}
