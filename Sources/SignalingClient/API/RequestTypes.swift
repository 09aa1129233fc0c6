import SignalingProtocol

/// The server accepted a request (OK).
public struct RequestAcceptance: Sendable, Equatable {
    /// Server clock when accepted, ms since the Unix epoch; for a message, its timestamp.
    public var serverTime: UInt64
}

/// Why a request did not complete. Messages and push registrations are never dropped:
/// they are kept and re-sent until the server answers, and only end with an error the
/// server gave (not retryable) or when the client shuts down (the unsent request is in
/// the error so the app can persist it).
public enum RequestError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The server answered ERROR; nothing changed on the server.
    case rejected(ErrorCode, message: String)
    /// A call request needs a live connection and there is none (calls are not queued:
    /// a call set up minutes late is worse than a clear failure).
    case notConnected
    /// The connection dropped after a call request was sent and before its reply; the
    /// outcome is unknown, and the call's events (which are re-delivered) tell the truth.
    case connectionLost
    /// A field is not acceptable to the protocol (empty or over-long id, control
    /// characters, body over the frame limit...). Nothing was sent.
    case invalidArgument(String)
    /// The client was shut down before the server accepted the request.
    case clientShutDown(unsent: Request)

    public var description: String {
        switch self {
        case .rejected(let code, let message): return "rejected: \(code) (\(code.rawValue)) \(message)"
        case .notConnected: return "not connected"
        case .connectionLost: return "connection lost before the reply"
        case .invalidArgument(let message): return "invalid argument: \(message)"
        case .clientShutDown: return "client shut down"
        }
    }
}

public typealias RequestCompletion = @Sendable (Result<RequestAcceptance, RequestError>) -> Void
