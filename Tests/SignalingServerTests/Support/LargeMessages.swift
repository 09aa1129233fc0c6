import SignalingProtocol

/// Numbered messages with large bodies, for tests of backlogs and memory: message `index`
/// has id "m<index>" and a body of `size` bytes all equal to `index` (mod 256), so a body
/// that comes back can be checked byte for byte.
enum LargeMessages {
    static let size = 60_000

    static func body(_ index: Int, size: Int = LargeMessages.size) -> [UInt8] {
        [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: size)
    }

    static func request(_ index: Int, to recipient: String, size: Int = LargeMessages.size) -> Request {
        .messageSend(OutgoingMessage(messageID: "m\(index)", recipient: recipient, contentType: "application/octet-stream", body: body(index, size: size)))
    }
}

extension TestClient {
    /// Reads messages m1...m`count` (skipping other frames), checks each id, body and that
    /// numbers grow, and returns the last number. Acknowledges nothing.
    @discardableResult
    func receiveLargeMessages(count: Int, size: Int = LargeMessages.size, timeout: Duration = .seconds(30)) throws -> UInt64 {
        var lastSeq: UInt64 = 0
        for index in 1...count {
            let (seq, event) = try nextEvent(timeout: timeout)
            guard case .message(let message) = event else { throw TestClient.Failure("event \(seq) is not a message") }
            guard message.messageID == "m\(index)", message.body == LargeMessages.body(index, size: size), seq > lastSeq else {
                throw TestClient.Failure("event \(seq): \(message.messageID) with \(message.body.count) bytes after \(lastSeq), expected m\(index)")
            }
            lastSeq = seq
        }
        return lastSeq
    }
}
