import SignalingProtocol

extension Request {
    /// A text message whose body is its own id, so that a test can tell from the bytes
    /// alone which message arrived where (durability, store and failover tests).
    static func identifiedMessage(_ id: String, to recipient: String) -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(id.utf8)))
    }
}
