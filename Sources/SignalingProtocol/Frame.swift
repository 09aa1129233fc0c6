/// One protocol frame, decoded. docs/PROTOCOL.md describes the bytes of each case.
public enum Frame: Equatable, Sendable {
    case hello(Hello)
    case welcome(Welcome)
    case ping
    case pong
    /// Cumulative: every event with a sequence number ≤ `seq` is acknowledged.
    case ack(seq: UInt64)
    case close(Close)
    /// A client request; the server answers with exactly one `.ok` or `.error` carrying
    /// the same request id.
    case request(id: UInt32, Request)
    /// The request succeeded. `serverTime` is the server's clock (ms since the Unix epoch)
    /// when it was accepted; for MESSAGE_SEND it is the message's server timestamp.
    case ok(requestID: UInt32, serverTime: UInt64)
    /// The request failed and changed nothing.
    case error(requestID: UInt32, code: ErrorCode, message: String)
    /// A server event with the device's next sequence number.
    case event(seq: UInt64, Event)

    public var type: FrameType {
        switch self {
        case .hello: return .hello
        case .welcome: return .welcome
        case .ping: return .ping
        case .pong: return .pong
        case .ack: return .ack
        case .close: return .close
        case .request(_, let request): return request.type
        case .ok: return .ok
        case .error: return .error
        case .event(_, let event): return event.type
        }
    }
}

/// Where a reconnecting client left off: the session it had and the highest event
/// sequence number it received (and processed) in it.
public struct ResumePoint: Equatable, Sendable {
    public var sessionID: SessionID
    public var lastReceivedSeq: UInt64

    public init(sessionID: SessionID, lastReceivedSeq: UInt64) {
        self.sessionID = sessionID
        self.lastReceivedSeq = lastReceivedSeq
    }
}

/// The client's opening frame.
public struct Hello: Equatable, Sendable {
    public var version: UInt16
    public var userID: String
    public var deviceID: String
    /// Opaque credentials (with the server's HMAC scheme: a device token, docs/AUTH.md).
    public var credentials: [UInt8]?
    public var resume: ResumePoint?
    /// Requested keep-alive interval in seconds; 0 lets the server choose. Values
    /// 1...599 are refused with CLOSE `keepAliveTooShort`.
    public var requestedKeepAliveSeconds: UInt32

    public init(
        version: UInt16 = ProtocolLimits.version, userID: String, deviceID: String,
        credentials: [UInt8]? = nil, resume: ResumePoint? = nil,
        requestedKeepAliveSeconds: UInt32 = 0
    ) {
        self.version = version
        self.userID = userID
        self.deviceID = deviceID
        self.credentials = credentials
        self.resume = resume
        self.requestedKeepAliveSeconds = requestedKeepAliveSeconds
    }
}

/// The server's answer to a successful HELLO.
public struct Welcome: Equatable, Sendable {
    public var version: UInt16
    public var sessionID: SessionID
    /// True when the HELLO's resume point was honoured.
    public var resumed: Bool
    /// The keep-alive interval the client must use (never below 600 s).
    public var keepAliveSeconds: UInt32
    /// The server closes the connection after this long without any frame from the client
    /// (1.5 × `keepAliveSeconds`, rounded up).
    public var idleTimeoutSeconds: UInt32
    /// Server wall-clock time, ms since the Unix epoch.
    public var serverTime: UInt64
    /// The largest frame (type byte plus body) the server accepts.
    public var maxFrameLength: UInt32
    /// Every event with a sequence number ≤ this is acknowledged; the server (re)sends
    /// everything after it (or after the resume point, when resumed).
    public var ackedSeq: UInt64
    /// The highest sequence number the server has ever assigned to this device (0 for a
    /// device it does not know). A client that has processed a higher number is talking to
    /// a server that lost its state, whose numbering starts again: it must reset its
    /// de-duplication floor.
    public var lastSeq: UInt64

    public init(
        version: UInt16 = ProtocolLimits.version, sessionID: SessionID, resumed: Bool,
        keepAliveSeconds: UInt32, idleTimeoutSeconds: UInt32, serverTime: UInt64,
        maxFrameLength: UInt32, ackedSeq: UInt64, lastSeq: UInt64 = 0
    ) {
        self.version = version
        self.sessionID = sessionID
        self.resumed = resumed
        self.keepAliveSeconds = keepAliveSeconds
        self.idleTimeoutSeconds = idleTimeoutSeconds
        self.serverTime = serverTime
        self.maxFrameLength = maxFrameLength
        self.ackedSeq = ackedSeq
        self.lastSeq = max(lastSeq, ackedSeq)
    }
}

/// The server's last frame on a connection: why, and what the client should do next.
public struct Close: Equatable, Sendable {
    public var code: CloseCode
    public var action: ReconnectAction
    /// Wait at least this long before reconnecting...
    public var retryAfterMs: UInt32
    /// ...plus a uniformly random extra delay in 0...retryJitterMs.
    public var retryJitterMs: UInt32
    public var message: String

    public init(
        code: CloseCode, action: ReconnectAction? = nil, retryAfterMs: UInt32 = 0,
        retryJitterMs: UInt32 = 0, message: String
    ) {
        self.code = code
        self.action = action ?? code.defaultAction
        self.retryAfterMs = retryAfterMs
        self.retryJitterMs = retryJitterMs
        self.message = message
    }
}

/// Client requests. The caller's user and device are those of the session.
public enum Request: Equatable, Sendable {
    case callInvite(callID: String, callee: String, offer: [UInt8])
    case callRinging(callID: String)
    case callAccept(callID: String, answer: [UInt8])
    /// `reason` must be `.declined` or `.busy`.
    case callReject(callID: String, reason: CallEndReason)
    case callCancel(callID: String)
    case callHangup(callID: String)
    case messageSend(OutgoingMessage)
    /// Registers one push token of this device. `platform` names the kind of token
    /// (`apns-voip`, `apns`, `fcm`; any other value is for the generic webhook gateway);
    /// a device holds one token per kind, and an empty token unregisters that kind.
    /// `environment` (`production` when nil, or `sandbox`) and `topic` (the app's bundle
    /// id) are for APNs. They are optional trailing fields on the wire: nil is not
    /// written, and `topic` can only be written after an `environment` (possibly empty),
    /// so the encoder writes an empty environment when only a topic is given.
    case pushRegister(platform: String, token: [UInt8], environment: String? = nil, topic: String? = nil)

    public var type: FrameType {
        switch self {
        case .callInvite: return .callInvite
        case .callRinging: return .callRinging
        case .callAccept: return .callAccept
        case .callReject: return .callReject
        case .callCancel: return .callCancel
        case .callHangup: return .callHangup
        case .messageSend: return .messageSend
        case .pushRegister: return .pushRegister
        }
    }
}

/// A message as the sender submits it.
public struct OutgoingMessage: Equatable, Sendable {
    /// Chosen by the sender, unique per sender; the server de-duplicates on it.
    public var messageID: String
    public var recipient: String
    public var contentType: String
    public var body: [UInt8]

    public init(messageID: String, recipient: String, contentType: String, body: [UInt8]) {
        self.messageID = messageID
        self.recipient = recipient
        self.contentType = contentType
        self.body = body
    }
}

/// A message as a recipient device receives it.
public struct DeliveredMessage: Equatable, Sendable {
    public var messageID: String
    public var sender: String
    public var senderDevice: String
    public var recipient: String
    public var contentType: String
    public var body: [UInt8]
    /// When the server accepted it, ms since the Unix epoch.
    public var serverTime: UInt64

    public init(
        messageID: String, sender: String, senderDevice: String, recipient: String,
        contentType: String, body: [UInt8], serverTime: UInt64
    ) {
        self.messageID = messageID
        self.sender = sender
        self.senderDevice = senderDevice
        self.recipient = recipient
        self.contentType = contentType
        self.body = body
        self.serverTime = serverTime
    }
}

/// Server events. Each is sent with a sequence number and re-sent until acknowledged.
public enum Event: Equatable, Sendable {
    /// To every online device of the callee.
    case callIncoming(callID: String, caller: String, callerDevice: String, offer: [UInt8], serverTime: UInt64)
    /// To the caller's device: a callee device is ringing.
    case callRang(callID: String, device: String)
    /// To the caller's device: a callee device answered.
    case callAccepted(callID: String, device: String, answer: [UInt8])
    /// To the parties' devices: the call is over. `peer` is the other party's user id.
    case callEnded(callID: String, reason: CallEndReason, peer: String, serverTime: UInt64)
    /// To every device of the recipient (except the sending device).
    case message(DeliveredMessage)
    /// To the sender's devices: a recipient device acknowledged the message.
    case messageDelivered(messageID: String, recipient: String, recipientDevice: String, serverTime: UInt64)

    public var type: FrameType {
        switch self {
        case .callIncoming: return .callIncoming
        case .callRang: return .callRang
        case .callAccepted: return .callAccepted
        case .callEnded: return .callEnded
        case .message: return .message
        case .messageDelivered: return .messageDelivered
        }
    }
}
