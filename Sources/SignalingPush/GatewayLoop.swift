import SignalingStore
import CLibeventShims
import SignalingSupport
import Synchronization

/// The gateway's thread: one libevent `event_base` with the inbox's eventfd, a periodic
/// tick, a deferred "pump" event, up to `maxConcurrentRequests` webhook connections, and
/// libcurl's HTTP/2 connections to APNs and FCM (`HTTP2Client`).
///
/// Concurrency: everything here is confined to the loop's thread except `requestStop`
/// (an atomic flag, followed by an eventfd wake) and the `ticks`/`finished` atomics. The
/// loop's thread is the inbox's only consumer while it runs (takes and closes it).
/// `@unchecked Sendable` only so that the object can be handed to its thread.
final class GatewayLoop: @unchecked Sendable {
    let configuration: PushGatewayConfiguration
    /// The webhook gateway's host as an IP literal (resolved once at start), if any.
    let address: String?
    let inbox: GatewayInbox
    let counters: PushCounters
    let clock: any Clock
    let logger: Logger

    let base: OpaquePointer
    var scheduler: WakeUpScheduler
    /// One per possible concurrent request; created lazily, reused (keep-alive).
    var connections: [GatewayConnection] = []
    /// Indices into `connections` with no request on the wire.
    var idleConnections: [Int] = []
    /// Retryable failures since the last delivery, to log a failing gateway once rather
    /// than every attempt.
    var consecutiveFailures = 0
    /// The HTTP/2 client APNs and FCM share (nil when neither is configured).
    var http: HTTP2Client?
    var apns: APNsClient?
    var fcm: FCMClient?
    /// Attempts the scheduler has started whose service has no free slot yet, per service
    /// (at most one per device, so bounded by `maxQueuedDevices`).
    var queued: [PushService: FIFOQueue<WakeUpScheduler.Attempt>] = [:]
    /// Requests on the wire to APNs and FCM.
    var streams: [PushService: Int] = [:]
    /// Invalid tokens are reported here (to remove them from the server and its store).
    let onTokenInvalid: @Sendable (WakeUp, PushRegistration, String) -> Void
    /// The last time each rejection reason was logged, to log each at most once a minute.
    var rejectionLog: [String: (at: Instant, suppressed: Int)] = [:]
    /// The wake-ups taken from the inbox, folded per device, before the scheduler takes
    /// them (kept between batches for its storage; at most `maxQueuedDevices`).
    private var batch: [WakeUp] = []
    private var coalescer = WakeUpCoalescer()

    private var wakeEvent: OpaquePointer?
    private var tickEvent: OpaquePointer?
    private var pumpEvent: OpaquePointer?
    let stopRequested = Atomic<Bool>(false)
    /// Ticks run so far (read by `PushGateway.awaitTicks`).
    let ticks = Atomic<Int>(0)
    /// Set when `run` has returned.
    let finished = Atomic<Bool>(false)

    init(
        configuration: PushGatewayConfiguration, address: String?, inbox: GatewayInbox,
        counters: PushCounters, clock: any Clock, logger: Logger,
        onTokenInvalid: @escaping @Sendable (WakeUp, PushRegistration, String) -> Void = { _, _, _ in }
    ) throws(PushGatewayError) {
        guard let base = vs_event_base_new() else { throw PushGatewayError("cannot create an event base") }
        self.base = base
        self.configuration = configuration
        self.address = address
        self.inbox = inbox
        self.counters = counters
        self.clock = clock
        self.logger = logger
        let prefix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        scheduler = WakeUpScheduler(
            configuration: configuration, counters: counters,
            idPrefix: String(repeating: "0", count: 8 - prefix.count) + prefix)
        self.onTokenInvalid = onTokenInvalid
        if configuration.apns != nil || configuration.fcm != nil {
            let http = try HTTP2Client(base: base, caFile: configuration.caFile, maxStreams: configuration.maxConcurrentStreams)
            self.http = http
            apns = configuration.apns.map { APNsClient(configuration: $0, http: http, clock: clock, timeout: configuration.requestTimeout) }
            fcm = configuration.fcm.map { FCMClient(configuration: $0, http: http, clock: clock, timeout: configuration.requestTimeout) }
        }
    }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Runs on the gateway's thread until `requestStop`.
    func run() {
        let persistRead = Int16(VS_EV_READ | VS_EV_PERSIST)
        wakeEvent = vs_event_new(base, inbox.wakeFD, persistRead, { _, _, arg in
            Unmanaged<GatewayLoop>.fromOpaque(arg!).takeUnretainedValue().takeInbox()
        }, unmanagedSelf)
        tickEvent = vs_event_new(base, -1, Int16(VS_EV_PERSIST), { _, _, arg in
            Unmanaged<GatewayLoop>.fromOpaque(arg!).takeUnretainedValue().tick()
        }, unmanagedSelf)
        pumpEvent = vs_event_new(base, -1, 0, { _, _, arg in
            Unmanaged<GatewayLoop>.fromOpaque(arg!).takeUnretainedValue().pump()
        }, unmanagedSelf)
        vs_event_add(wakeEvent, -1)
        vs_event_add(tickEvent, max(1, configuration.tickInterval.microseconds))

        vs_event_base_dispatch(base)

        // Connections first: freeing one frees its queued request without calling back.
        for connection in connections { connection.free() }
        connections = []
        http?.close()
        http = nil
        for event in [wakeEvent, tickEvent, pumpEvent] { if let event { vs_event_free(event) } }
        vs_event_base_free(base)
        finished.store(true, ordering: .releasing)
    }

    /// Any thread: asks the loop to stop at its next wake (the caller then wakes it).
    func requestStop() {
        stopRequested.store(true, ordering: .releasing)
    }

    private func takeInbox() {
        if stopRequested.load(ordering: .acquiring) {
            shutDown()
            return
        }
        if let credentials = inbox.takeCredentials() {
            // Between two requests: each signs with the old material or the new, never a mix.
            if let new = credentials.apns { apns?.replaceCredentials(new) }
            if let new = credentials.fcm { fcm?.replaceCredentials(new) }
        }
        inbox.takeAll(appendingTo: &batch)
        // Folded here, not by the submitters, who share no lock (see `GatewayInbox`).
        counters.coalesced.increment(by: coalescer.coalesce(&batch))
        let now = clock.now()
        for wakeUp in batch { scheduler.accept(wakeUp, now: now) }
        batch.removeAll(keepingCapacity: true)
        pump()
    }

    private func tick() {
        expireOverdueRequests(now: SystemClock().now())
        pump()
        ticks.add(1, ordering: .releasing)
    }

    /// Starts every due wake-up there is room for: a free webhook connection, or a free
    /// HTTP/2 stream to APNs or FCM. An attempt whose service is full waits in that
    /// service's queue, so a slow service never holds up the others.
    func pump() {
        guard !stopRequested.load(ordering: .relaxed) else { return }
        let now = clock.now()
        let wallSeconds = clock.wallMilliseconds() / 1000
        for service in PushService.allCases { startQueued(service) }
        while PushService.allCases.contains(where: hasRoom), let attempt = scheduler.nextDue(now: now, wallSeconds: wallSeconds) {
            queued[attempt.request.service, default: FIFOQueue()].push(attempt)
            startQueued(attempt.request.service)
        }
    }

    /// Whether a request to `service` could start now.
    private func hasRoom(_ service: PushService) -> Bool {
        guard queued[service]?.isEmpty ?? true else { return false }
        switch service {
        case .webhook:
            return configuration.endpoint != nil && (!idleConnections.isEmpty || connections.count < configuration.maxConcurrentRequests)
        case .apns: return apns != nil && streams[.apns, default: 0] < configuration.maxConcurrentStreams
        case .fcm: return fcm != nil && streams[.fcm, default: 0] < configuration.maxConcurrentStreams
        }
    }

    /// Starts the queued attempts of `service` while it has room.
    private func startQueued(_ service: PushService) {
        while var waiting = queued[service], !waiting.isEmpty {
            switch service {
            case .webhook:
                guard let index = idleConnections.popLast() ?? newConnectionIndex() else { return }
                let attempt = waiting.pop()!
                queued[service] = waiting
                send(attempt, on: connections[index])
            case .apns, .fcm:
                guard streams[service, default: 0] < configuration.maxConcurrentStreams else { return }
                let attempt = waiting.pop()!
                queued[service] = waiting
                sendStream(attempt)
            }
        }
    }

    /// Pumps once the current libevent callback has returned: completions happen inside
    /// libevent's HTTP code, which should not be re-entered with a new request.
    func pumpSoon() {
        if let pumpEvent { vs_event_active(pumpEvent) }
    }

    /// A slot for a new connection, while fewer than the concurrency limit exist.
    private func newConnectionIndex() -> Int? {
        guard connections.count < configuration.maxConcurrentRequests else { return nil }
        connections.append(GatewayConnection(loop: self, index: connections.count))
        return connections.count - 1
    }

    /// Cancels what is in flight, drops what waits, and leaves the event loop.
    private func shutDown() {
        for connection in connections where connection.isBusy {
            connection.cancel()
            counters.inFlight.increment(by: -1)
        }
        // Streams in flight are abandoned with the client (`run` closes it after the loop);
        // the scheduler still counts them as sending, so removeAll counts them.
        counters.inFlight.increment(by: -streams.values.reduce(0, +))
        streams = [:]
        queued = [:]
        _ = fcm?.dropWaiting()
        counters.droppedStopped.increment(by: scheduler.removeAll())
        // This thread is the inbox's consumer, the one that may close it; later
        // submissions are refused.
        counters.droppedStopped.increment(by: inbox.close())
        vs_event_base_loopbreak(base)
    }
}
