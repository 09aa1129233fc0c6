import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Sends wake-ups for devices without a live connection to a push gateway over HTTP.
///
///     let gateway = try PushGateway(configuration: try PushGatewayConfiguration(url: "http://127.0.0.1:8088/wake"))
///     try gateway.start()
///     gateway.submit(WakeUp(userID: "bob", deviceID: "phone", registration: registration,
///                           kind: .call, pendingEvents: 3))   // any thread; never waits for the network
///     gateway.stop()
///
/// The gateway runs its own libevent `event_base` on its own thread; its HTTP requests are
/// non-blocking, so a gateway that is down, slow or hanging delays nothing but its own
/// wake-ups. `submit` is the only entry from other threads: it pushes the wake-up onto a
/// lock-free inbox (O(1), no lock: `GatewayInbox`) and wakes the thread through an eventfd
/// when the inbox was empty. Everything else (coalescing per device, schedule,
/// connections, requests) is confined to the gateway's thread.
///
/// A server without a configured gateway simply creates none (see `WakeUpSubmitter`).
public final class PushGateway: WakeUpSubmitter, Sendable {
    public let configuration: PushGatewayConfiguration
    let clock: any Clock
    let logger: Logger
    let counters = PushCounters()
    let inbox: GatewayInbox
    private let run = Mutex(RunState())

    private struct RunState: ~Copyable {
        var loop: GatewayLoop?
        var onTokenInvalid: @Sendable (WakeUp, PushRegistration, String) -> Void = { _, _, _ in }
        var thread: JoinableThread?
        var started = false
        var stopped = false
    }

    /// - Parameters:
    ///   - clock: read for every interval and back-off decision (tests inject a
    ///     `ManualClock`; the loop looks at it every `tickInterval`). The request timeout
    ///     is real time: it guards real I/O.
    public init(
        configuration: PushGatewayConfiguration, clock: any Clock = SystemClock(), logger: Logger = Logger()
    ) throws(UsageError) {
        try configuration.validate()
        do {
            inbox = try GatewayInbox(capacity: configuration.maxQueuedDevices)
        } catch {
            throw UsageError(error.description)
        }
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
    }

    /// A gateway released without `stop()` stops here (the thread holds no reference to
    /// the gateway, so this does run).
    deinit { stop() }

    /// Resolves the gateway's host (once; see `HostResolver`) and starts the thread.
    /// Wake-ups submitted before are sent once it runs.
    public func start() throws(PushGatewayError) {
        let alreadyStarted = run.withLock { $0.started || $0.stopped }
        guard !alreadyStarted else { throw PushGatewayError("a push gateway can be started only once") }
        let address = try configuration.endpoint.map { endpoint throws(PushGatewayError) in try HostResolver.numericAddress(of: endpoint.host) }
        // The thread starts under `run`, so that a `stop` racing with this start either
        // finds the thread to stop or makes this start fail: never a thread running after
        // `stop` has closed the inbox from its own thread (only one consumer at a time).
        try run.withLock { state throws(PushGatewayError) in
            guard !state.started && !state.stopped else { throw PushGatewayError("a push gateway can be started only once") }
            let loop = try GatewayLoop(
                configuration: configuration, address: address, inbox: inbox, counters: counters, clock: clock, logger: logger,
                onTokenInvalid: state.onTokenInvalid)
            state.loop = loop
            state.thread = JoinableThread(name: "vs-push") { loop.run() }
            state.started = true
        }
        logger.info("push_gateway_started", [
            "webhook": configuration.endpoint?.description ?? "-", "address": address ?? "-",
            "apns": configuration.apns.map { "team=\($0.teamID) key=\($0.keyID) topic=\($0.defaultTopic)" } ?? "-",
            "fcm": configuration.fcm?.account.projectID ?? "-",
            "concurrency": configuration.maxConcurrentRequests,
        ])
    }

    /// Which registrations this gateway can carry (the services configured).
    public var routing: PushRouting { configuration.routing }

    /// Sets what runs, on the gateway's thread, when a service declares a device's token
    /// invalid (APNs 410/Unregistered/BadDeviceToken, FCM 404/UNREGISTERED): the server
    /// removes it from the device and the store. Call before `start`; it must not block.
    public func onTokenInvalid(_ handler: @escaping @Sendable (WakeUp, PushRegistration, String) -> Void) {
        run.withLock { $0.onTokenInvalid = handler }
    }

    /// Stops: requests in flight are cancelled, every wake-up not yet delivered is dropped
    /// (counted in `droppedStopped`; the events themselves stay queued on the server for
    /// the device's next connection), and submissions are refused from the moment the
    /// gateway's thread shuts down (those that land while `stop` runs are queued and then
    /// dropped, counted the same way; after `stop` returns every one is refused). Returns
    /// when the thread has exited and freed its connections. Harmless to call twice.
    public func stop() {
        let (thread, loop, wasStopped) = run.withLock { state -> (JoinableThread?, GatewayLoop?, Bool) in
            guard !state.stopped else { return (nil, nil, true) }
            state.stopped = true
            defer { state.thread = nil }
            return (state.thread, state.loop, false)
        }
        guard !wasStopped else { return }
        if let thread, let loop {
            // The gateway's thread closes the inbox itself when it shuts down (it is the
            // inbox's consumer, the only thread that may take or close).
            loop.requestStop()
            inbox.wake()
            thread.join()
        }
        // The thread has exited (or never ran): this thread is the consumer now. Closes
        // the inbox of a gateway that never started (a second close takes nothing).
        counters.droppedStopped.increment(by: inbox.close())
        if thread != nil { logger.info("push_gateway_stopped", ["stats": statistics.description]) }
    }

    /// Hands a wake-up to the gateway's thread. Any thread; takes no lock, never blocks on
    /// I/O; O(1). Wake-ups for one device that wait in the inbox together are folded into
    /// one (higher-ranked kind, latest counter) on the gateway's thread when it takes
    /// them, each fold counted in `coalesced` there. Returns false when it was refused at
    /// once: `maxQueuedDevices` submissions are waiting in the inbox (not yet taken by the
    /// gateway's thread, whatever their devices), or the gateway has stopped.
    @discardableResult
    public func submit(_ wakeUp: WakeUp) -> Bool {
        counters.submitted.increment()
        switch inbox.add(wakeUp) {
        case .queued:
            return true
        case .full:
            counters.droppedQueueFull.increment()
            return false
        case .closed:
            counters.droppedStopped.increment()
            return false
        }
    }

    /// Puts new signing material in force (a reload): the APNs key, key id and team id of
    /// `apns`, the service account of `fcm` (their endpoints and other settings are fixed
    /// at start). The caller builds them off the push loop (reading and parsing a key);
    /// the loop takes them between two requests, so each request signs with the old
    /// material or the new, never a mix. The next APNs request signs a new provider token
    /// with the new key, and the next FCM message exchanges a new assertion; requests in
    /// flight finish with what they had. Any thread.
    ///
    /// Throws, changing nothing, for a service the gateway was not started with or
    /// material that does not validate.
    public func replaceCredentials(apns: APNsConfiguration?, fcm: FCMConfiguration?) throws(UsageError) {
        if let apns {
            guard configuration.apns != nil else { throw UsageError("APNs was not configured at start") }
            try apns.validate()
        }
        if let fcm {
            guard configuration.fcm != nil else { throw UsageError("FCM was not configured at start") }
            try fcm.validate()
        }
        guard apns != nil || fcm != nil else { return }
        inbox.replaceCredentials(PushCredentials(apns: apns, fcm: fcm))
        logger.info("push_credentials_replaced", [
            "apns": apns.map { "team=\($0.teamID) key=\($0.keyID)" } ?? "-", "fcm": fcm?.account.clientEmail ?? "-",
        ])
    }

    public var statistics: PushStatistics { counters.snapshot() }

    /// Waits until the gateway's thread has run `count` more timer ticks, so that a change
    /// made on an injected clock has been acted on. For tests and tools. False on timeout
    /// or when the gateway is not running.
    public func awaitTicks(_ count: Int = 2, timeout: Duration = .seconds(10)) -> Bool {
        guard let loop = run.withLock({ $0.loop }) else { return false }
        let start = loop.ticks.load(ordering: .acquiring)
        let deadline = SystemClock().now() + timeout
        while SystemClock().now() < deadline {
            if loop.finished.load(ordering: .acquiring) { return false }
            if loop.ticks.load(ordering: .acquiring) >= start + count { return true }
            usleep(500)
        }
        return false
    }
}
