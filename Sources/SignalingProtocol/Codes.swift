/// What a client should do after the server closed its connection.
///
/// Every CLOSE frame carries one, so a client never has to guess: it never hammers a
/// server that told it to stop, and never gives up when it should retry.
public enum ReconnectAction: UInt8, Sendable, CaseIterable {
    /// Do not reconnect automatically: the problem needs a human or a new build
    /// (bad credentials, protocol bug, another copy of this device took over).
    case stop = 0
    /// Reconnect after the advised delay and resume the session (send the resume point).
    case resume = 1
    /// Reconnect after the advised delay without a resume point: the session is gone.
    case fresh = 2
    /// Get fresh credentials (from the app's backend), then reconnect after the advised
    /// delay and resume: the device token expired or names a key the server does not
    /// hold. Sent only in answer to a version 1 device token (docs/AUTH.md), so a client
    /// that predates this value never receives it.
    case refreshCredentials = 3
}

/// Why the server closed a connection. Sent in CLOSE frames.
///
/// 3000–3499: transient, the client reconnects (after the delay in the frame).
/// 3500–3999: terminal, the client stops and reports the problem.
/// The table in docs/PROTOCOL.md gives the default advice for each code; the CLOSE frame's
/// own `action`, `retryAfterMs` and `retryJitterMs` fields are authoritative.
public enum CloseCode: UInt16, Sendable, CaseIterable {
    /// The server is shutting down or restarting; reconnect after the advised delay.
    case goingAway = 3000
    /// Too many handshakes right now (reconnect storm); retry after the advised delay.
    case overloaded = 3001
    /// Nothing was received for the idle timeout (1.5 × keep-alive).
    case idleTimeout = 3002
    /// The client did not read its data; too many bytes were queued for it.
    case slowConsumer = 3003
    /// No HELLO arrived within the handshake deadline.
    case handshakeTimeout = 3004
    /// The server hit an unexpected internal condition.
    case internalError = 3005
    /// Too many connections from this network address.
    case tooManyConnections = 3006
    /// The resume point names a session the server does not know (expired or never existed).
    case sessionUnknown = 3007
    /// The resume point or an ACK acknowledges more events than the server sent.
    case invalidSequence = 3008
    /// The device token's expiry has passed: get a fresh one and reconnect (action
    /// `refreshCredentials`).
    case tokenExpired = 3009
    /// The device token names a key id the server does not hold: retired after a
    /// rotation, or not loaded yet. Get a fresh token and reconnect (action
    /// `refreshCredentials`, with a longer delay).
    case unknownKey = 3010

    /// Another connection of the same device took over this session. Never reconnect
    /// automatically: two copies of one device would otherwise evict each other forever.
    case replaced = 3500
    /// The bytes received are not a valid frame (bad length, truncated fields, bad UTF-8).
    case malformedFrame = 3501
    /// The HELLO asked for a protocol version the server does not speak.
    case unsupportedVersion = 3502
    /// The credentials in HELLO were missing or wrong.
    case unauthorized = 3503
    /// A frame other than HELLO arrived before the handshake completed.
    case frameBeforeHello = 3504
    /// The length prefix exceeds the server's maximum frame size.
    case frameTooLarge = 3505
    /// The frame type is unknown or not allowed from a client.
    case unknownFrameType = 3506
    /// HELLO asked for a keep-alive interval under 600 s.
    case keepAliveTooShort = 3507
    /// A second HELLO arrived on an established connection.
    case duplicateHello = 3508
    /// A field holds a value outside its documented range (empty id, id too long...).
    case invalidField = 3509
    /// The device token's MAC does not match its key: tampered with, or signed with
    /// another secret under the same key id.
    case badSignature = 3510
    /// The device token is valid but for another device of this user.
    case wrongDevice = 3511

    /// The advice the server gives with this code by default.
    public var defaultAction: ReconnectAction {
        switch self {
        case .sessionUnknown, .invalidSequence: return .fresh
        case .tokenExpired, .unknownKey: return .refreshCredentials
        case .goingAway, .overloaded, .idleTimeout, .slowConsumer, .handshakeTimeout,
             .internalError, .tooManyConnections:
            return .resume
        case .replaced, .malformedFrame, .unsupportedVersion, .unauthorized, .frameBeforeHello,
             .frameTooLarge, .unknownFrameType, .keepAliveTooShort, .duplicateHello, .invalidField, .badSignature,
             .wrongDevice:
            return .stop
        }
    }
}

/// Why a single request failed. Sent in ERROR frames; the connection stays open and
/// nothing changed on the server.
public enum ErrorCode: UInt16, Sendable, CaseIterable {
    /// A field is syntactically valid but not acceptable (empty content type, bad reason...).
    case badRequest = 100
    /// The call id names no call the server knows.
    case unknownCall = 200
    /// The sender is not a party to the call (or not the device bound to it).
    case notCallParticipant = 201
    /// The call is not in a state that allows this step (accept an active call...).
    case illegalCallTransition = 202
    /// The call id is already used by another live call.
    case callIdInUse = 203
    /// Callers cannot call their own user id.
    case cannotCallSelf = 204
    /// One of the recipient's devices has too many unacknowledged events; retry later.
    case recipientBacklogFull = 300
    /// The sender already has its share of unacknowledged messages waiting for one of the
    /// recipient's devices (`--max-pending-per-sender`); retry later.
    case senderQuotaExceeded = 301
    /// The sender sends messages or calls faster than `--sender-rate`; retry later.
    case rateLimited = 302
    /// The durable store could not commit the request; retry later. Nothing was accepted.
    case storeUnavailable = 400
    /// The server holds as much undelivered data as it may (`--memory-budget`); retry
    /// later. Nothing was accepted.
    case capacityExceeded = 401
    /// The server hit an unexpected internal condition; nothing was accepted.
    case internalError = 500

    /// True when sending the same request again later may succeed.
    public var isRetryable: Bool {
        switch self {
        case .recipientBacklogFull, .senderQuotaExceeded, .rateLimited, .storeUnavailable, .capacityExceeded, .internalError:
            return true
        default: return false
        }
    }
}

/// Why a call ended, in CALL_ENDED events. Also the reject reasons a callee may give.
public enum CallEndReason: UInt8, Sendable, CaseIterable {
    /// A party hung up an active call.
    case hungUp = 1
    /// The caller gave up before the call was answered.
    case cancelled = 2
    /// The callee declined.
    case declined = 3
    /// The callee is busy.
    case busy = 4
    /// No device of the callee could be reached.
    case unreachable = 5
    /// Nobody answered within the ring timeout (a missed call, for the callee).
    case noAnswer = 6
    /// Another device of the callee answered.
    case answeredElsewhere = 7
    /// Another device of the callee declined.
    case declinedElsewhere = 8
    /// The other party's device disconnected and did not come back in time.
    case peerDisconnected = 9

    /// The reasons a callee may put in CALL_REJECT.
    public var isRejectReason: Bool { self == .declined || self == .busy }
}
