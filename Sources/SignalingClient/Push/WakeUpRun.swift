import SignalingSupport

/// One `handleWakeUp` in progress. Owned by the client's queue (`ClientCore.push`).
///
/// The run is over when the app has processed what the server had pending when the
/// connection was made. Two signals say so, whichever comes first:
/// - the app processed every number up to the WELCOME's `lastSeq` (exact, unless the
///   server's numbering has holes at the end: numbers reserved before a restart, or a
///   message refused after it was numbered);
/// - a PONG arrived on the connection after the connect, and the app processed every
///   event delivered before it. The server writes a device's pending events as it sends
///   WELCOME, before it reads the client's next frame, so they precede the answer to any
///   PING the client sent after WELCOME. (Under backpressure the server may hold back
///   events; the run then ends early, and those events still arrive on the connection.)
struct WakeUpRun {
    let payload: WakeUpPayload
    let task: BackgroundTaskIdentifier
    let startedAt: Instant
    /// The run ends here at the latest: the background task's allowance less its
    /// expiration warning, as an app's own expiration handler would.
    let deadline: Instant
    let completion: @Sendable (WakeUpOutcome) -> Void
    var session: SessionInfo?
    /// The blocking connect returned with a session: only from then on can the run drain.
    private(set) var connected = false
    /// The highest number delivered when the barrier PONG arrived.
    private(set) var barrierFloor: UInt64?
    private(set) var eventsProcessed = 0

    init(payload: WakeUpPayload, task: BackgroundTaskIdentifier, startedAt: Instant, deadline: Instant,
         completion: @escaping @Sendable (WakeUpOutcome) -> Void) {
        self.payload = payload
        self.task = task
        self.startedAt = startedAt
        self.deadline = deadline
        self.completion = completion
    }

    mutating func connected(_ session: SessionInfo) {
        self.session = session
        connected = true
    }

    /// A PONG arrived on the current connection; `lastDelivered` is the highest number
    /// handed to the app so far. Before the connect returned a PONG proves nothing.
    mutating func pongReceived(lastDelivered: UInt64) {
        if connected && barrierFloor == nil { barrierFloor = lastDelivered }
    }

    mutating func eventProcessed() { eventsProcessed += 1 }

    /// Whether everything pending at the connection has been processed.
    func isDrained(lastProcessed: UInt64, welcomeLastSeq: UInt64) -> Bool {
        guard connected else { return false }
        if lastProcessed >= welcomeLastSeq { return true }
        if let barrierFloor, lastProcessed >= barrierFloor { return true }
        return false
    }

    func outcome(_ ending: WakeUpOutcome.Ending, now: Instant) -> WakeUpOutcome {
        WakeUpOutcome(payload: payload, ending: ending, session: session, eventsProcessed: eventsProcessed,
                      duration: now - startedAt)
    }
}

/// The client's push state, owned by its queue.
struct PushState {
    var accepted = AcceptedPushRegistrations()
    var wakeUps: [UInt64: WakeUpRun] = [:]
    var nextWakeUpID: UInt64 = 0
    /// The `lastSeq` of the current (or last) connection's WELCOME.
    var welcomeLastSeq: UInt64 = 0

    var nextDeadline: Instant? { wakeUps.values.map(\.deadline).min() }
}
