import SignalingProtocol
import SignalingTLS

/// Where a connection slot is in its life.
enum ConnectionState: UInt8 {
    /// Not started yet (waiting in the connect queue).
    case unstarted
    /// TCP connect in progress.
    case connecting
    /// TLS handshake in progress (TLS runs only).
    case securing
    /// HELLO sent, waiting for WELCOME.
    case handshaking
    case established
    /// Disconnected; reconnects when its timer fires.
    case waiting
    /// Gave up for good (terminal CLOSE, or no connection before its deadline).
    case failed
}

/// Per-connection state as parallel arrays (struct of arrays), about 66 bytes a
/// connection: no object, no string and no buffer per connection (over TLS, OpenSSL's
/// own state per connection and its last session come on top). Partial frames and
/// unsent bytes, which are rare, live in side tables keyed by slot.
struct ConnectionTable {
    var fd: [Int32]
    var state: [ConnectionState]
    /// Consecutive failed attempts (for the back-off).
    var attempts: [UInt8]
    var hasSession: [Bool]
    /// Milliseconds since the worker started: next PING when established, next attempt
    /// when waiting, handshake deadline while connecting or handshaking.
    var timer: [UInt32]
    /// Milliseconds since the worker started after which a waiting slot gives up.
    var giveUpAt: [UInt32]
    /// CLOCK_MONOTONIC nanoseconds when the current attempt started.
    var attemptStartedAt: [UInt64]
    /// Highest event sequence number processed: drops duplicates, is the ACK and the
    /// resume point.
    var lastSeq: [UInt64]
    var session: [SessionID]
    /// The TLS connection while connected over TLS (nil or one pointer: 8 bytes).
    var tls: [TLSConnection?]
    /// The session (the server's ticket) of the slot's last TLS connection, offered when
    /// it reconnects so that a storm resumes instead of doing full handshakes.
    var tlsSession: [TLSSession?]

    init(count: Int) {
        fd = Array(repeating: -1, count: count)
        state = Array(repeating: .unstarted, count: count)
        attempts = Array(repeating: 0, count: count)
        hasSession = Array(repeating: false, count: count)
        timer = Array(repeating: 0, count: count)
        giveUpAt = Array(repeating: 0, count: count)
        attemptStartedAt = Array(repeating: 0, count: count)
        lastSeq = Array(repeating: 0, count: count)
        session = Array(repeating: SessionID(high: 0, low: 0), count: count)
        tls = Array(repeating: nil, count: count)
        tlsSession = Array(repeating: nil, count: count)
    }

    var count: Int { fd.count }
}

/// Exponential back-off with full jitter for connections that end without a CLOSE
/// (docs/PROTOCOL.md 4.4): a random delay in 0...min(cap, base·2^attempt).
struct Backoff {
    static let baseMilliseconds: UInt32 = 50
    static let capMilliseconds: UInt32 = 2_000

    static func delay(attempt: UInt8, random: UInt64) -> UInt32 {
        let ceiling = min(capMilliseconds, baseMilliseconds << UInt32(min(attempt, 10)))
        return UInt32(random % UInt64(ceiling + 1))
    }
}

