/// What one protocol's bytes mean to the probe. The same client-side method (connect,
/// stamp, send, epoll, read, clock) runs over either dialect; only the framing differs.
protocol Dialect: Sendable {
    /// What a subscriber sends once its TCP connection is up.
    func subscriberGreeting(_ subscriber: Int) -> [UInt8]
    /// What the publisher sends once its TCP connection is up.
    func publisherGreeting() -> [UInt8]
    /// One event for `subscriber`, with `payload` as its last bytes (so the send stamp
    /// goes at `count - payload.count`).
    func publication(number: Int, subscriber: Int, payload: [UInt8]) -> [UInt8]
    /// Consumes the complete packets at the start of `bytes`, received on the connection of
    /// `subscriber` (nil: the publisher's), into `inbound`. Returns the bytes used.
    func consume(_ bytes: UnsafeRawBufferPointer, subscriber: Int?, into inbound: inout Inbound) -> Int
}

/// What the packets of one read held. Reused from read to read (`reset` keeps capacity).
struct Inbound {
    /// Bytes to send back on the same connection (the next handshake step, ACKs, PONG).
    var reply: [UInt8] = []
    /// The handshake completed (subscribed, for MQTT; welcomed, for voip).
    var established = false
    /// The send stamps of the events that arrived.
    var stamps: [UInt64] = []
    /// Events addressed to another subscriber than the one whose connection carried them.
    var misrouted = 0
    /// Replies to the publisher's requests (voip only).
    var oks = 0
    var errors = 0
    var lastError: String?
    /// A refusal, a CLOSE or a malformed packet: the connection is unusable.
    var problem: String?

    init() {
        reply.reserveCapacity(64)
        stamps.reserveCapacity(64)
    }

    mutating func reset() {
        reply.removeAll(keepingCapacity: true)
        stamps.removeAll(keepingCapacity: true)
        established = false
        misrouted = 0
        oks = 0
        errors = 0
        lastError = nil
        problem = nil
    }
}

/// The send stamp at the start of an event payload: CLOCK_REALTIME nanoseconds (the clock of
/// the kernel's receive timestamps), little-endian.
func sendStamp(_ payload: UnsafeRawBufferPointer) -> UInt64? {
    payload.count >= 8 ? UInt64(littleEndian: payload.loadUnaligned(as: UInt64.self)) : nil
}

/// What a connection has read that its dialect has not used yet (a packet or frame not
/// complete): the probe's one copy of stream reassembly. It cannot be `FrameAssembler`
/// (SignalingProtocol): the probe reads MQTT too, whose framing is not VSIG's, through the
/// same path. A read with nothing kept is consumed where it lies; only an incomplete tail
/// is copied, and what stays kept is at most one packet, so the cost is O(bytes).
struct PartialInput {
    private var kept: [UInt8] = []

    /// No bytes wait for the rest of their packet.
    var isEmpty: Bool { kept.isEmpty }

    /// Hands `arrived`, after what was kept, to `dialect`; keeps what it did not use.
    mutating func consume(_ arrived: UnsafeRawBufferPointer, dialect: any Dialect, subscriber: Int?, into inbound: inout Inbound) {
        if kept.isEmpty {
            let used = dialect.consume(arrived, subscriber: subscriber, into: &inbound)
            if used < arrived.count { kept = Array(arrived[used...]) }
        } else {
            kept.append(contentsOf: arrived)
            let used = kept.withUnsafeBytes { dialect.consume($0, subscriber: subscriber, into: &inbound) }
            kept.removeFirst(used)
        }
    }
}
