import SignalingProtocol

/// Everything the client tells the app, delivered in order on the app's queue.
public enum ClientEvent: Sendable, Equatable {
    case connectionStateChanged(ConnectionState)
    /// CALL_INCOMING: ring (or show a missed call if a `callEnded` follows at once).
    case incomingCall(IncomingCall)
    /// CALL_RANG: a callee device is ringing (to the caller).
    case callRinging(callID: String, device: String)
    /// CALL_ACCEPTED: a callee device answered (to the caller).
    case callAccepted(callID: String, device: String, answer: [UInt8])
    /// CALL_ENDED. `peer` is the other party's user id.
    case callEnded(callID: String, reason: CallEndReason, peer: String, serverTime: UInt64)
    /// MESSAGE.
    case messageReceived(DeliveredMessage)
    /// MESSAGE_DELIVERED: a recipient device acknowledged a message this user sent.
    case deliveryReceipt(DeliveryReceipt)
    case applicationStateChanged(ApplicationState)
    /// The simulated system woke the suspended (or backgrounded) app.
    case woken(WakeReason)
    /// A PING was answered.
    case keepAliveAnswered(roundTrip: Duration)
    /// The app's keep-alive handler did not return within its budget (10 s).
    case keepAliveHandlerExpired
    /// The allowance ran out with this task still running; the system ended it (on iOS
    /// the app would have been killed).
    case backgroundTaskExpired(BackgroundTaskIdentifier, name: String)
    /// The client posted a local notification (`removed` is the oldest one dropped at
    /// the cap, if any).
    case notificationPosted(LocalNotification, removed: LocalNotification?)
    /// The network changed in a way that affects the connection.
    case networkPathChanged(NetworkPathChange)
}

public struct IncomingCall: Sendable, Equatable {
    public var callID: String
    public var caller: String
    public var callerDevice: String
    public var offer: [UInt8]
    public var serverTime: UInt64
}

public struct DeliveryReceipt: Sendable, Equatable {
    public var messageID: String
    public var recipient: String
    public var recipientDevice: String
    public var serverTime: UInt64
}

/// The connection as the app sees it.
public enum ConnectionState: Sendable, Equatable, CustomStringConvertible {
    /// Not connected and not trying: never connected, or `disconnect()` was called.
    case disconnected
    /// A connect-then-mark attempt is running (`attempt` counts consecutive attempts).
    case connecting(attempt: Int)
    /// Handshaken and marked.
    case connected(SessionInfo)
    /// The connection is gone; the next attempt starts after `delay` (back-off, or the
    /// server's advice), or at the next wake if the app is suspended.
    case waitingToReconnect(delay: Duration, reason: DisconnectReason)
    /// No automatic reconnection: the server said stop, or the client was shut down.
    /// An explicit `connect(timeout:)` starts again.
    case stopped(StopReason)

    public var description: String {
        switch self {
        case .disconnected: return "disconnected"
        case .connecting(let attempt): return "connecting(attempt \(attempt))"
        case .connected(let session): return "connected(\(session.localAddress) -> \(session.remoteAddress), session \(session.sessionID), resumed \(session.resumed))"
        case .waitingToReconnect(let delay, let reason): return "waiting(\(delay), \(reason))"
        case .stopped(let reason): return "stopped(\(reason))"
        }
    }
}

/// Why a connection was lost or an attempt failed.
public enum DisconnectReason: Sendable, Equatable, CustomStringConvertible {
    /// The TCP connection ended without a CLOSE (reset, EOF, write error).
    case connectionLost(String)
    /// A PING got no PONG within the deadline.
    case keepAliveTimedOut
    /// The server sent CLOSE with a reconnect action.
    case serverClosed(Close)
    /// The path the socket used went away, or a better one appeared.
    case networkChanged(NetworkPathChange)
    /// A connect attempt failed.
    case connectFailed(ConnectError)
    /// The server's bytes broke the protocol.
    case protocolViolation(String)

    public var description: String {
        switch self {
        case .connectionLost(let detail): return "connection lost: \(detail)"
        case .keepAliveTimedOut: return "no PONG in time"
        case .serverClosed(let close): return "server closed: \(close.code) \(close.message)"
        case .networkChanged(let change): return "network changed: \(change)"
        case .connectFailed(let error): return "connect failed: \(error)"
        case .protocolViolation(let message): return "protocol violation: \(message)"
        }
    }
}

public enum StopReason: Sendable, Equatable, CustomStringConvertible {
    /// CLOSE with action `stop` (replaced, unauthorized, ...), during or after the handshake.
    case serverRefused(Close)
    case shutDown

    public var description: String {
        switch self {
        case .serverRefused(let close): return "server: \(close.code) \(close.message)"
        case .shutDown: return "shut down"
        }
    }
}

/// What a WELCOME established.
public struct SessionInfo: Sendable, Equatable {
    public var sessionID: SessionID
    public var resumed: Bool
    /// The server's keep-alive interval (≥ 600 s).
    public var keepAliveInterval: Duration
    public var idleTimeout: Duration
    /// Server clock at WELCOME, ms since the Unix epoch.
    public var serverTime: UInt64
    /// The largest frame the server accepts (requests are checked against it).
    public var maxFrameLength: Int
    public var localAddress: SocketAddress
    public var remoteAddress: SocketAddress
    /// Socket options the marking could not set (empty normally).
    public var markingFailures: [MarkingFailure]
    /// The TLS in force; nil for plain TCP.
    public var tls: TLSSessionDetails? = nil
    /// The server of `ClientConfiguration.servers` that answered (`remoteAddress` is the
    /// address of it that was dialled).
    public var server: ServerEndpoint? = nil
}

/// What a connection's TLS handshake negotiated.
public struct TLSSessionDetails: Sendable, Equatable {
    public var version: TLSVersion
    /// The ALPN protocol the server selected (`vsig/1`); nil when it selected none.
    public var alpn: String?
    /// True when the handshake resumed the previous connection's session from its ticket
    /// (no certificate, no signature: the cheap reconnect).
    public var resumed: Bool
}

/// A snapshot for status displays (`voipclient status`).
public struct ClientStatus: Sendable, Equatable {
    public var connectionState: ConnectionState
    public var applicationState: ApplicationState
    public var sessionID: SessionID?
    /// The keep-alive interval in force (the larger of the app's and the server's).
    public var keepAliveInterval: Duration
    public var lastPongRoundTrip: Duration?
    /// Connections established after the first one.
    public var reconnectCount: Int
    /// Durable requests (messages, push registrations) not yet accepted by the server.
    public var pendingRequests: Int
    /// The highest event sequence number the app has processed.
    public var lastProcessedSequence: UInt64
    public var pendingNotifications: Int
}

/// A change of the network that matters to the connection.
public enum NetworkPathChange: Sendable, Equatable, CustomStringConvertible {
    /// The local address the socket is bound to is no longer configured.
    case localAddressRemoved(SocketAddress)
    /// The system would now reach the server from another local address.
    case betterPathAvailable(from: SocketAddress, to: SocketAddress)
    /// While disconnected, the network changed: a good moment to retry.
    case networkChangedWhileDisconnected

    public var description: String {
        switch self {
        case .localAddressRemoved(let address): return "local address \(address.host) removed"
        case .betterPathAvailable(let from, let to): return "better path: \(from.host) -> \(to.host)"
        case .networkChangedWhileDisconnected: return "network changed while disconnected"
        }
    }
}
