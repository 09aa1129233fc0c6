import SignalingSupport

/// The keep-alive timer and its deadlines, as a state machine: the client feeds it the
/// time and events, it answers with actions. Owned by the client's queue.
///
/// Rules (docs/CLIENT.md, "Keep-alive"):
/// - the interval is never under 600 s, and never shorter than the server's WELCOME
///   interval: the effective interval is `max(app's interval, server's interval)`, so the
///   client never pings more often than the server asked;
/// - the handler runs when the interval has passed since the previous run (never later,
///   give or take timer resolution); it may run earlier when re-armed;
/// - each run has a budget (10 s); a run still going at the end of it has expired;
/// - a PING unanswered for `pongTimeout` (10 s) means the connection is dead.
struct KeepAliveSchedule {
    enum Action: Equatable {
        /// Time to run the keep-alive handler (a wake of the app).
        case runHandler
        /// The PING sent `roundTrip` ago got no PONG in time.
        case pongOverdue
        /// The app's handler did not return within its budget.
        case handlerExpired
    }

    static let minimumInterval: Duration = .seconds(600)

    let budget: Duration
    let pongTimeout: Duration
    /// Set by `setKeepAliveTimeout`; nil = the server's interval.
    private(set) var appInterval: Duration?
    /// From the last WELCOME.
    private(set) var serverInterval: Duration?
    private(set) var nextRun: Instant?
    private(set) var pingSentAt: Instant?
    private(set) var pongDeadline: Instant?
    private(set) var handlerDeadline: Instant?
    private(set) var lastRoundTrip: Duration?

    init(budget: Duration, pongTimeout: Duration) {
        self.budget = budget
        self.pongTimeout = pongTimeout
    }

    /// The interval in force.
    var interval: Duration {
        max(appInterval ?? Self.minimumInterval, serverInterval ?? Self.minimumInterval)
    }

    var nextDeadline: Instant? {
        [nextRun, pongDeadline, handlerDeadline].compactMap { $0 }.min()
    }

    /// Installs the app's interval (the caller has checked the 600 s floor) and re-arms so
    /// the next run is no later than one interval from now.
    mutating func setAppInterval(_ interval: Duration?, now: Instant) {
        appInterval = interval
        rearm(notLaterThan: now + self.interval)
    }

    /// A WELCOME arrived: its interval applies, and the next ping is one interval away.
    mutating func connected(serverInterval seconds: UInt32, now: Instant) {
        serverInterval = .seconds(Int64(seconds))
        pingSentAt = nil
        pongDeadline = nil
        nextRun = now + interval
    }

    /// The connection is gone: no PONG can come. The timer keeps running (it is how a
    /// suspended app gets to reconnect).
    mutating func disconnected(now: Instant) {
        pingSentAt = nil
        pongDeadline = nil
        if nextRun == nil { nextRun = now + interval }
    }

    /// Stops everything (client stopped by the app or by the server).
    mutating func stop() {
        nextRun = nil
        pingSentAt = nil
        pongDeadline = nil
        handlerDeadline = nil
    }

    /// Arms the timer if it is not armed (the client wants a connection).
    mutating func start(now: Instant) {
        if nextRun == nil { nextRun = now + interval }
    }

    mutating func tick(now: Instant) -> [Action] {
        var actions: [Action] = []
        if let deadline = pongDeadline, now >= deadline {
            pongDeadline = nil
            pingSentAt = nil
            actions.append(.pongOverdue)
        }
        if let deadline = handlerDeadline, now >= deadline {
            handlerDeadline = nil
            actions.append(.handlerExpired)
        }
        if let due = nextRun, now >= due {
            nextRun = now + interval
            handlerDeadline = now + budget
            actions.append(.runHandler)
        }
        return actions
    }

    /// Starts a run now, ahead of the timer (a platform keep-alive that fired earlier).
    mutating func runNow(now: Instant) {
        nextRun = now + interval
        handlerDeadline = now + budget
    }

    /// The app's handler returned.
    mutating func handlerFinished() { handlerDeadline = nil }

    /// True when a PING may be sent now (none is outstanding).
    var canPing: Bool { pingSentAt == nil }

    mutating func pingSent(now: Instant) {
        pingSentAt = now
        pongDeadline = now + pongTimeout
    }

    /// A PONG arrived; returns the round trip when it answers our PING.
    mutating func pongReceived(now: Instant) -> Duration? {
        guard let sent = pingSentAt else { return nil }
        pingSentAt = nil
        pongDeadline = nil
        lastRoundTrip = now - sent
        return lastRoundTrip
    }

    private mutating func rearm(notLaterThan latest: Instant) {
        if let current = nextRun, current <= latest { return }
        nextRun = latest
    }
}
