/// The documented exit statuses of `voipclient` (docs/VOIPCLIENT.md, "Exit status").
/// Scripts branch on these numbers, so they never change meaning.
public enum ExitStatus: Int32, Sendable, CaseIterable, CustomStringConvertible {
    /// The call or message did what was asked.
    case ok = 0
    /// The callee has no device the server could reach (CALL_ENDED `unreachable`).
    case calleeUnreachable = 2
    /// The callee declined or was busy (or auto-reject when a call was expected).
    case rejected = 3
    /// Nothing happened in time: the call rang out (server `noAnswer`) or `--timeout`
    /// passed (the call is then cancelled or hung up), or `listen`/`send` waited in vain.
    case timedOut = 4
    /// The server refused: CLOSE with "stop" (unauthorized, replaced...), an ERROR reply
    /// (cannotCallSelf, badRequest...), or bytes that break the protocol.
    case refused = 5
    /// `--require-media` / `--max-loss`: the call-path probe failed.
    case mediaFailed = 6
    /// The call broke after it was set up: the peer's device vanished
    /// (`peerDisconnected`) or the caller gave up on an answered call.
    case callDropped = 7
    /// Interactive mode ended (`quit`, Ctrl-D, end of input) with messages the server had
    /// not accepted (typed while it was down): they were dropped.
    case unsentMessages = 8
    /// Bad command line (sysexits EX_USAGE).
    case usage = 64
    /// The server cannot be reached: refused, timed out, no route, unknown host, or it
    /// is shedding load (sysexits EX_UNAVAILABLE).
    case serverUnreachable = 69
    /// An unexpected failure inside voipclient (sysexits EX_SOFTWARE).
    case internalError = 70
    /// Stopped by SIGINT (128 + 2).
    case interrupted = 130
    /// Stopped by SIGTERM or SIGHUP (128 + 15).
    case terminated = 143

    /// The stable word used in `--json` output ("status" of the `result` event).
    public var description: String {
        switch self {
        case .ok: return "ok"
        case .calleeUnreachable: return "callee_unreachable"
        case .rejected: return "rejected"
        case .timedOut: return "timed_out"
        case .refused: return "refused"
        case .mediaFailed: return "media_failed"
        case .callDropped: return "call_dropped"
        case .unsentMessages: return "unsent_messages"
        case .usage: return "usage"
        case .serverUnreachable: return "server_unreachable"
        case .internalError: return "internal_error"
        case .interrupted: return "interrupted"
        case .terminated: return "terminated"
        }
    }
}

/// How a command ended: the status and the one-line reason printed on stderr.
/// An `Error` too, so a failed step can carry it in a `Result`.
public struct Outcome: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: ExitStatus
    public var reason: String

    public init(_ status: ExitStatus, _ reason: String) {
        self.status = status
        self.reason = reason
    }

    public static func ok(_ reason: String) -> Outcome { Outcome(.ok, reason) }

    public var description: String { "\(status) (\(status.rawValue)): \(reason)" }
}
