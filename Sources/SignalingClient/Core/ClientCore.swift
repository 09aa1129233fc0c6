import Foundation
import SignalingProtocol
import SignalingSupport
import SignalingTLS

/// The client's state and logic. Every mutable property is owned by `queue`: the public
/// `SignalingClient` methods, the connections' I/O threads, the network monitor and the
/// timer all hop onto it, and nothing else touches the state. That confinement is the
/// concurrency rule of this class, which is why it is `@unchecked Sendable`.
///
/// Blocking work never runs on `queue`: connect attempts run on their own threads and
/// are waited for on the caller's thread (explicit `connect`) or on `connectQueue`
/// (automatic reconnects); the queue only creates and adopts them.
final class ClientCore: @unchecked Sendable {
    /// Where the connection is in its life.
    enum Lifecycle {
        /// Not connected and not trying: never started, or the app disconnected.
        case idle
        /// A connect-then-mark attempt runs on its background thread.
        case connecting(ConnectAttempt)
        /// Handshaken and marked; frames flow through the connection's I/O thread.
        case connected(Connection, SessionInfo)
        /// Lost; the next attempt is due at `until` (not before the next wake when
        /// the app is suspended).
        case waiting(until: Instant, delay: Duration, reason: DisconnectReason)
        /// No automatic reconnection until the app connects again.
        case stopped(StopReason)
    }

    let configuration: ClientConfiguration
    let clock: any Clock
    let logger: Logger
    let queue = DispatchQueue(label: "vsig.client")
    let eventQueue: DispatchQueue
    let eventHandler: @Sendable (ClientEvent) -> Void
    /// The streams of `SignalingClient.events()`, fed alongside `eventHandler`.
    let subscribers = EventSubscribers()
    /// Waits for automatic connect attempts, one at a time.
    let connectQueue = DispatchQueue(label: "vsig.client.connect")
    /// Monitor of the system's network; nil when not watching.
    let networkMonitor: (any NetworkMonitor)?
    /// TLS for every attempt (trust store loaded once); nil for plain TCP.
    let tls: TLSClientSetup?

    // MARK: State owned by `queue`

    var lifecycle: Lifecycle = .idle
    /// The app asked to be online (connect called, disconnect not called since).
    var wantsConnection = false
    var isShutDown = false
    var networkMonitorStarted = false
    var nextAttemptID: UInt64 = 0
    /// Failed attempts since the last connection (for `.connecting(attempt:)`).
    var consecutiveFailures = 0
    var backoff: ReconnectBackoff
    var connectedAt: Instant?
    var sessionID: SessionID?
    /// The HELLO credentials in use: the configuration's, then the last ones the
    /// provider gave that the server accepted.
    var credentials: [UInt8]?
    /// Set by a CLOSE with action `refreshCredentials`; the next attempt asks the
    /// provider first. Cleared by a successful handshake.
    var credentialsRefusal: Close?
    /// The TLS session of the last connection to each server (its ticket, by index in
    /// `configuration.servers`), offered by the next attempt to that server so a reconnect
    /// resumes instead of doing a full handshake.
    var tlsSessions: [Int: TLSSession] = [:]
    /// The server the next attempt tries first: the one that last worked (sticky), or the
    /// next one after a CLOSE that said its node cannot keep the device
    /// (`ServerRotation.preferred(after:connected:serverCount:)`).
    var preferredServer = 0
    var serverMaxFrame = ProtocolLimits.defaultMaxFrameLength
    var everConnected = false
    var reconnectCount = 0
    var lastNetworkTriggeredAttempt: Instant?
    var sequencer = EventSequencer()
    var recentMessages = RecentMessageIDs()
    var ackFlushScheduled = false
    var outbox = Outbox()
    var keepAlive: KeepAliveSchedule
    var keepAliveHandler: (@Sendable () -> Void)?
    var keepAliveRun: UInt64 = 0
    var background: BackgroundExecution
    var expirationHandlers: [BackgroundTaskIdentifier: @Sendable () -> Void] = [:]
    var notifications: LocalNotificationCenter
    /// Accepted push registrations and wake-ups in progress (ClientCore+Push).
    var push = PushState()
    var random = SystemRandomNumberGenerator()
    /// The most recent attempt (tests check that a timed-out one cleaned up).
    var lastAttempt: ConnectAttempt?
    private var timer: DispatchSourceTimer?

    init(configuration: ClientConfiguration, clock: any Clock, logger: Logger, eventQueue: DispatchQueue,
         eventHandler: @escaping @Sendable (ClientEvent) -> Void, networkMonitor: (any NetworkMonitor)?, tls: TLSClientSetup?) {
        self.configuration = configuration
        self.tls = tls
        self.clock = clock
        self.logger = logger
        self.eventQueue = eventQueue
        self.eventHandler = eventHandler
        self.networkMonitor = networkMonitor
        credentials = configuration.credentials
        backoff = ReconnectBackoff(policy: configuration.reconnect)
        keepAlive = KeepAliveSchedule(budget: configuration.keepAliveHandlerBudget, pongTimeout: configuration.pongTimeout)
        background = BackgroundExecution(policy: configuration.backgroundExecution)
        notifications = LocalNotificationCenter(capacity: configuration.notificationCapacity)
        let timer = DispatchSource.makeTimerSource(queue: queue)
        self.timer = timer
        timer.setEventHandler { [weak self] in self?.processTimers() }
        timer.schedule(deadline: .distantFuture)
        timer.activate()
    }

    // MARK: Delivering to the app

    func emit(_ event: ClientEvent) {
        let hand = handToApp
        eventQueue.async { hand(event) }
    }

    /// On the event queue: gives one event to the handler, then to every stream. The one
    /// place events reach the app, so the callback and the streams see the same order.
    var handToApp: @Sendable (ClientEvent) -> Void {
        { [handler = eventHandler, subscribers] event in
            handler(event)
            subscribers.yield(event)
        }
    }

    func emitConnectionState() { emit(.connectionStateChanged(publicConnectionState)) }

    var publicConnectionState: ConnectionState {
        switch lifecycle {
        case .idle: return .disconnected
        case .connecting: return .connecting(attempt: consecutiveFailures + 1)
        case .connected(_, let info): return .connected(info)
        case .waiting(_, let delay, let reason): return .waitingToReconnect(delay: delay, reason: reason)
        case .stopped(let reason): return .stopped(reason)
        }
    }

    var currentConnection: Connection? {
        if case .connected(let connection, _) = lifecycle { return connection }
        return nil
    }

    func status() -> ClientStatus {
        var sessionID: SessionID?
        if case .connected(_, let info) = lifecycle { sessionID = info.sessionID } else { sessionID = self.sessionID }
        return ClientStatus(
            connectionState: publicConnectionState, applicationState: background.state, sessionID: sessionID,
            keepAliveInterval: keepAlive.interval, lastPongRoundTrip: keepAlive.lastRoundTrip,
            reconnectCount: reconnectCount, pendingRequests: outbox.pendingDurableCount,
            lastProcessedSequence: sequencer.lastProcessed, pendingNotifications: notifications.pending.count)
    }

    // MARK: Timer

    /// Re-arms the one timer for the earliest deadline. While the app is suspended only
    /// the keep-alive timer and the background deadlines count: back-off and retry
    /// timers wait for the next wake, as they would on iOS.
    func rearmTimer() {
        guard let timer, !isShutDown else { return }
        var deadlines: [Instant] = []
        if let deadline = keepAlive.nextDeadline { deadlines.append(deadline) }
        if let deadline = background.nextDeadline { deadlines.append(deadline) }
        if let deadline = push.nextDeadline { deadlines.append(deadline) }
        if background.state != .suspended {
            if case .waiting(let until, _, _) = lifecycle { deadlines.append(until) }
            if currentConnection != nil, let retry = outbox.nextRetry { deadlines.append(retry) }
        }
        guard let next = deadlines.min() else {
            timer.schedule(deadline: .distantFuture)
            return
        }
        var wait = next - clock.now()
        if let cap = configuration.maximumTimerWait { wait = min(wait, cap) }
        let nanoseconds = Int(min(wait.seconds * 1e9, 1e15))
        timer.schedule(deadline: .now() + .nanoseconds(nanoseconds), repeating: .never, leeway: .milliseconds(1))
    }

    /// Runs everything that is due. Called by the timer; tests that drive a
    /// `ManualClock` call it (on `queue`) right after advancing the clock.
    func processTimers() {
        guard !isShutDown else { return }
        let now = clock.now()
        perform(background.tick(now: now))
        for action in keepAlive.tick(now: now) { perform(action, now: now) }
        finishOverdueWakeUps(now: now)
        if background.state != .suspended {
            if case .waiting(let until, _, _) = lifecycle, now >= until { startAutomaticConnect() }
            flushOutbox()
        }
        rearmTimer()
    }

    // MARK: Shutting down

    /// Disconnects for good: acknowledges what the app has processed (the ACK may still
    /// be waiting for its batch to end; without it the server would send those events
    /// again to the next process of this device), closes the connection, cancels any
    /// attempt, stops the monitor and the timer, and ends every pending request with
    /// `clientShutDown`.
    /// Returns the connection being closed, if there was one, so the caller can wait (off
    /// this queue) for its I/O thread to write what was queued.
    @discardableResult
    func shutdown() -> Connection? {
        guard !isShutDown else { return nil }
        wantsConnection = false
        flushAcknowledgement()
        let closing = currentConnection
        closeEverything()
        isShutDown = true
        networkMonitor?.stop()
        timer?.cancel()
        timer = nil
        keepAlive.stop()
        for (completion, request) in outbox.drainAll() {
            eventQueue.async { completion(.failure(.clientShutDown(unsent: request))) }
        }
        finishAllWakeUps(.clientShutDown)
        lifecycle = .stopped(.shutDown)
        emitConnectionState()
        eventQueue.async { [subscribers] in subscribers.finishAll() }
        return closing
    }

    /// Closes the connection or cancels the attempt, without deciding what comes next.
    func closeEverything() {
        switch lifecycle {
        case .connecting(let attempt):
            attempt.cancel()
        case .connected(let connection, _):
            connection.close()
            tearDownConnection()
        default:
            break
        }
    }

    /// The app no longer wants a connection. What it has processed is acknowledged
    /// first (see `shutdown`). Durable requests stay queued for the next `connect`; the
    /// keep-alive timer keeps running only if the app installed a handler.
    func disconnect() {
        guard !isShutDown else { return }
        wantsConnection = false
        flushAcknowledgement()
        closeEverything()
        if keepAliveHandler == nil { keepAlive.stop() }
        lifecycle = .idle
        emitConnectionState()
        rearmTimer()
    }
}
