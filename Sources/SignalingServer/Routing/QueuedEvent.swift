import SignalingProtocol

/// One event as queued to one or more devices: encoded once and shared by every queue it
/// was fanned out to.
///
/// Everything is immutable except `isCancelled`, which is guarded by the `Switchboard`
/// lock (hence `@unchecked Sendable`): a message whose commit to the store failed is
/// cancelled in every queue at once, and the pump skips it.
final class QueuedEvent: @unchecked Sendable {
    let encoded: EncodedEvent
    /// For MESSAGE events: what to report to the sender when a device acknowledges it.
    let receipt: DeliveryReceipt?
    /// Wall-clock creation time (ms), for storage.
    let createdAt: UInt64
    /// Never written to a device: its message was refused after all (store failure), or it
    /// fills a sequence number that a restarted server no longer has an event for.
    var isCancelled = false

    init(_ event: Event, receipt: DeliveryReceipt? = nil, createdAt: UInt64) {
        self.encoded = EncodedEvent(event)
        self.receipt = receipt
        self.createdAt = createdAt
    }

    init(encoded: EncodedEvent, receipt: DeliveryReceipt?, createdAt: UInt64) {
        self.encoded = encoded
        self.receipt = receipt
        self.createdAt = createdAt
    }

    /// A cancelled event that only occupies a sequence number.
    static func placeholder() -> QueuedEvent {
        let event = QueuedEvent(encoded: EncodedEvent(type: .callRang, body: []), receipt: nil, createdAt: 0)
        event.isCancelled = true
        return event
    }
}

/// Who wants to know that a message reached a device.
struct DeliveryReceipt: Sendable {
    let sender: String
    let messageID: String
    let recipient: String
}
