/// The one-byte type that follows every frame's length prefix.
///
/// Numbers are grouped by role so a trace is readable at a glance: 0x0_ connection
/// control, 0x1_ client requests, 0x2_ replies to requests, 0x3_ call events, 0x4_
/// message events. docs/PROTOCOL.md is the normative description of each.
public enum FrameType: UInt8, Sendable, CaseIterable {
    // Connection control.
    /// Client → server, first frame on every connection.
    case hello = 0x01
    /// Server → client, the successful answer to HELLO.
    case welcome = 0x02
    /// Either direction; the client sends it on its keep-alive schedule.
    case ping = 0x03
    /// Either direction; the answer to PING.
    case pong = 0x04
    /// Client → server, cumulative acknowledgement of events.
    case ack = 0x05
    /// Server → client, the last frame before the server closes the connection.
    case close = 0x06

    // Client requests: each carries a request id and gets exactly one OK or ERROR.
    case callInvite = 0x10
    case callRinging = 0x11
    case callAccept = 0x12
    case callReject = 0x13
    case callCancel = 0x14
    case callHangup = 0x15
    case messageSend = 0x16
    case pushRegister = 0x17

    // Replies.
    case ok = 0x20
    case error = 0x21

    // Events: each carries a sequence number and stays pending until acknowledged.
    case callIncoming = 0x30
    case callRang = 0x31
    case callAccepted = 0x32
    case callEnded = 0x33
    case message = 0x40
    case messageDelivered = 0x41
}

/// Which side of a connection sends a frame.
public enum FrameSender: Sendable {
    case client, server
}

extension FrameType {
    /// Whether `sender` may send this type (docs/PROTOCOL.md, section 3: the direction
    /// column). PING and PONG go both ways; every other type has one direction.
    public func isSent(by sender: FrameSender) -> Bool {
        switch self {
        case .ping, .pong:
            return true
        case .hello, .ack, .callInvite, .callRinging, .callAccept, .callReject, .callCancel, .callHangup,
             .messageSend, .pushRegister:
            return sender == .client
        case .welcome, .close, .ok, .error, .callIncoming, .callRang, .callAccepted, .callEnded, .message,
             .messageDelivered:
            return sender == .server
        }
    }
}
