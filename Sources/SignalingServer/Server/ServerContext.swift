import SignalingCrypto
import SignalingProtocol
import SignalingPush
import SignalingSupport
import SignalingTLS
import Synchronization

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): those of `tokenVerifiers` and
// `tlsContexts` (`Reloadable`), leaves held for the copy of one reference: by the main
// thread on a reload, by each loop once after a reload (its handshakes read its own copy,
// checking one atomic word), by the admin thread (certificate expiry). Never taken under
// another lock but a loop's `ownership` or the reload's `settings`.

/// What every event loop of one server shares. Immutable, or internally synchronised.
final class ServerContext: Sendable {
    let configuration: ServerConfiguration
    let clock: any Clock
    let logger: Logger
    let switchboard: Switchboard
    let admission: AdmissionControl
    let counters: StatisticsCounters
    /// Failed authentications: at most one `auth_failed` line a second, with a count.
    let authFailureLog = LogThrottle()
    /// Paces the warn lines of requests refused by a backlog or a limit.
    let refusalLog = LogThrottle()
    /// Paces the warn lines of connections refused for a bad PROXY header.
    let proxyHeaderLog = LogThrottle()
    /// Paces the `tls_handshake_failed` lines (scanners and old clients make many).
    let tlsHandshakeLog = LogThrottle()
    /// Time zero of the server's second-granularity timeline (connection stamps).
    let startInstant: Instant
    /// `configuration.storeTimeout` in nanoseconds, worked out once: every message's
    /// deadline is `Instant.adding(nanoseconds:)` it.
    let storeTimeoutNanoseconds: UInt64
    /// Set on a front (docs/CLUSTER.md, "Fronts"): the loops relay their devices to the
    /// home and run no protocol (EventLoop+Front.swift).
    let front: FrontRelay?
    /// Loop 0's hold on the loops' scheduling policy (`--loop-realtime`; nil: off, or
    /// `auto` with `busyPoll`). It moves the threads only once the start has found the
    /// process permitted (`SignalingServer.askLoopRealtime`).
    let loopPriority: LoopPriorityControl?

    /// The clock's monotonic time. Read through this rather than `context.clock.now()`:
    /// there a caller copies the existential clock first (through its value witnesses,
    /// about 40 instructions, several reads a message on a loop), since nothing else keeps
    /// the context alive during the call; in a method of the context `self` does, and the
    /// clock is only borrowed.
    func now() -> Instant { clock.now() }

    /// The clock's wall time in milliseconds since the Unix epoch (see `now()` for why
    /// through the context).
    func wallMilliseconds() -> UInt64 { clock.wallMilliseconds() }

    /// Runs `body` with the switchboard borrowed, not retained. Every loop reaches the one
    /// switchboard through its context, and a loop's path that copied the reference (`let
    /// switchboard = context.switchboard`, a retain and a release per ACK) wrote its
    /// reference count from every core in turn: the object's cache line (the count, and
    /// `shards` and `writer`, which every hold reads) moved between the cores at each copy,
    /// 0.75 reference-count writes per event of a fan-out across two shards
    /// (docs/LOAD-TESTING.md, "Routing on more cores"). The context keeps the switchboard
    /// for as long as it lives itself, so `body` may use it without a reference of its own.
    @inline(__always)
    func withSwitchboard<Result>(_ body: (Switchboard) -> Result) -> Result {
        Unmanaged.passUnretained(switchboard)._withUnsafeGuaranteedRef(body)
    }

    init(
        configuration: ServerConfiguration, clock: any Clock, logger: Logger, journaling: Bool,
        pushGateway: (any WakeUpSubmitter)?, tokenVerifier: TokenVerifier?, tlsContext: TLSServerContext? = nil,
        front: FrontRelay? = nil
    ) {
        self.configuration = configuration
        self.front = front
        let realtimePriority = configuration.busyPoll > .zero ? 0 : configuration.loopRealtime.wantedPriority
        self.loopPriority = realtimePriority > 0 ? LoopPriorityControl(priority: realtimePriority, logger: logger, hostCPUTimePath: configuration.hostCPUTimePath) : nil
        self.tlsContexts = Reloadable(tlsContext)
        self.pushGateway = pushGateway
        self.tokenVerifiers = Reloadable(tokenVerifier)
        self.clock = clock
        self.logger = logger
        self.counters = StatisticsCounters(loops: configuration.workers)
        let now = clock.now()
        self.switchboard = Switchboard(
            configuration: configuration.switchboard, epoch: now, journaling: journaling,
            shardCount: Switchboard.shardCount(workers: configuration.workers))
        self.startInstant = now
        self.storeTimeoutNanoseconds = configuration.storeTimeout.wholeNanoseconds
        self.admission = AdmissionControl(
            maxConnectionsPerAddress: configuration.maxConnectionsPerAddress,
            handshakeRate: configuration.handshakeRate, now: now)
    }

    /// The token keys and legacy secret, each prepared once (nil: no authentication). A
    /// reload (SIGHUP) may replace it; each handshake reads it once, through its loop's
    /// copy (`EventLoop.tokenVerifier`), without a lock unless a reload replaced it.
    let tokenVerifiers: Reloadable<TokenVerifier?>

    /// What new TLS connections are made from: certificate, key, minimum version, ticket
    /// key (nil: no TLS listener). A reload (SIGHUP) builds a new one off the loops and
    /// swaps it in; each TLS accept reads it once, through its loop's copy
    /// (`EventLoop.tlsContext`). Connections made from an older one keep it alive (OpenSSL
    /// counts its references), so a reload drops nobody.
    let tlsContexts: Reloadable<TLSServerContext?>

    /// The verifier in force, for threads that are not loops (takes the lock); setting it
    /// is a reload's.
    var tokenVerifier: TokenVerifier? {
        get { tokenVerifiers.value }
        set { tokenVerifiers.replace(with: newValue) }
    }

    /// The TLS context in force, for threads that are not loops (takes the lock); setting
    /// it is a reload's.
    var tlsContext: TLSServerContext? {
        get { tlsContexts.value }
        set { tlsContexts.replace(with: newValue) }
    }

    /// The push gateway, when one is configured.
    let pushGateway: (any WakeUpSubmitter)?

    /// Passes a push wake-up request to the gateway (without one it is only logged, at
    /// debug level). Never blocks: the gateway queues and coalesces on its own thread.
    func requestWakeUp(_ effect: SwitchboardEffect) {
        guard case .wakeUp(let wakeUp) = effect else { return }
        guard let pushGateway else {
            logger.debug("wake_up_skipped", [
                "user": wakeUp.userID, "device": wakeUp.deviceID, "kind": wakeUp.kind.rawValue, "reason": "no push gateway",
            ])
            return
        }
        if !pushGateway.submit(wakeUp) {
            logger.debug("wake_up_dropped", ["user": wakeUp.userID, "device": wakeUp.deviceID])
        }
    }

    /// Records that `bytes` wait in one connection's `outbound` (only called when a write
    /// came up short, never per event).
    func noteOutbound(_ bytes: Int) {
        counters.largestOutbound.raise(to: bytes)
    }

    /// Whole seconds since the server started, rounded down.
    func seconds(at instant: Instant) -> UInt32 {
        UInt32(clamping: instant.wholeSeconds(since: startInstant))
    }
}
