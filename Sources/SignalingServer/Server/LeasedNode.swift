import SignalingStore
import SignalingSupport
import Synchronization

/// A node that serves only while it holds the store's lease (docs/CLUSTER.md): exactly one
/// active node per store, any number of standbys.
///
/// - **Standby**: no device listener (a load balancer's `/readyz` probe and a client's
///   server list send devices elsewhere); the admin API, if configured, answers `/healthz`
///   200, `/readyz` 503 with the reason, `/metrics` with `voipserver_role{role="standby"}`.
///   It tries to take the lease every `pollInterval`.
/// - **Active**: once it holds the lease it opens the store, loads its snapshot (everything
///   acknowledged is there) and starts a `SignalingServer`; it refreshes the lease every
///   third of its TTL (`LeaseTerm`), also while the snapshot loads.
/// - **Stepping down**: when the lease is lost, or cannot be refreshed before it could have
///   expired, the server is fenced and drained (`SignalingServer.stepDown`) before another
///   node can take the lease; the node then waits as a standby. Each active term starts
///   from the store, never from the memory of an earlier term.
///
/// - **Cluster member** (`--cluster`, docs/CLUSTER.md "Fronts"): made with a `NodeLink`,
///   the node serves devices in every role. While another node holds the lease it is a
///   **front**: a `SignalingServer` in front mode relays its devices to the lease holder
///   (the *home*), which it learns at each poll (asking the link, while the home is not
///   heard listening yet, whether it listens: `FrontRelay`); `/readyz` is 200 while the
///   link is up and a home exists and listens. When it takes the lease it drains its front connections (CLOSE
///   goingAway) and starts its home server, then listens on the link as its lease owner id
///   for the term (fronts address it once they hear that it listens); after stepping down
///   it stops listening as that id and is a front again.
///
/// Threading: one thread (`vs-lease`) runs the roles and the lease; a second one starts
/// the server of a term, so that a long snapshot load (or a front's drain) does not stop
/// the refreshes. The link's thread hands its events to the front or the home server.
/// `stop`, `reload` and the accessors may be called from any thread.
public final class LeasedNode: Sendable {
    public enum Role: String, Sendable {
        case standby, active, front
    }

    private let lease: any StoreLease
    private let clock: any Clock
    private let logger: Logger
    private let openStore: @Sendable (_ fencingToken: String) throws(StoreError) -> any EventStore
    private let stopping = Atomic<Bool>(false)
    private let state: Mutex<State>
    /// A cluster member's relay to the home while it is a front (nil: not a cluster member).
    private let front: FrontRelay?

    private struct State: ~Copyable {
        var configuration: ServerConfiguration
        var role = Role.standby
        /// The active term's server, once started.
        var server: SignalingServer?
        /// The active term's server from the moment it takes the link's events (before it
        /// starts) until the term ends: the link's events go to it.
        var linkedHome: SignalingServer?
        /// A cluster member's front server, while it is a front.
        var frontServer: SignalingServer?
        /// Why this node is a standby (`/readyz`).
        var standbyReason = "starting"
        var thread: JoinableThread?
        /// The instant on the node's clock the lease thread sleeps until (its next refresh,
        /// step-down or attempt to take the lease), nil while it is awake.
        var sleepingUntil: Instant?
    }

    /// Where the lease thread sleeps until, nil while it is awake: a test on a manual clock
    /// moves time to exactly this instant, then waits for the next one.
    var leaseThreadSleepsUntil: Instant? { state.withLock { $0.sleepingUntil } }

    /// How often a standby tries to take the lease: a tenth of its TTL, at least 100 ms. A
    /// standby takes over at most this long after the lease expired.
    public var pollInterval: Duration { max(.milliseconds(100), lease.ttl / 10) }

    /// - Parameter link: makes the node a cluster member (see the type): it is a front while
    ///   another node holds the lease. The node starts and stops it.
    /// - Parameter openStore: opens the store of a new active term, fenced with the term's
    ///   token (the lease's `ownerID`). Called on the start thread.
    public init(
        configuration: ServerConfiguration, lease: any StoreLease, clock: any Clock = SystemClock(), logger: Logger,
        link: (any NodeLink)? = nil,
        openStore: @escaping @Sendable (_ fencingToken: String) throws(StoreError) -> any EventStore
    ) {
        self.lease = lease
        self.clock = clock
        self.logger = logger
        self.openStore = openStore
        self.front = link.map { FrontRelay(link: $0) }
        state = Mutex(State(configuration: configuration))
    }

    public var role: Role { state.withLock { $0.role } }

    /// The configuration in force (the start's, with every reload since).
    public var configuration: ServerConfiguration { state.withLock { $0.configuration } }

    /// The active server's listeners, or that this node is a standby (or a front).
    public var listeningDescription: String {
        state.withLock { state in
            if let server = state.server { return server.listeningDescription }
            if let front = state.frontServer { return "front, listening on \(front.listeningDescription) (\(state.standbyReason))" }
            return "standby (\(state.standbyReason))"
        }
    }

    /// The front server while this cluster member is a front (for tests).
    var frontServer: SignalingServer? { state.withLock { $0.frontServer } }

    /// Starts the lease thread (and a cluster member's link): the node begins as a standby
    /// (or a front) and returns at once.
    public func start() {
        if let front {
            front.link.start { [weak self] event in self?.linkEvent(event) }
        }
        let thread = JoinableThread(name: "vs-lease") { [self] in run() }
        state.withLock { $0.thread = thread }
    }

    /// An event of the link (on its thread): to the home server while this node is home
    /// (packets only to it), and to the front relay, which keeps the link's state across
    /// terms.
    private func linkEvent(_ event: NodeLinkEvent) {
        guard let front else { return }
        if let home = state.withLock({ $0.linkedHome }) {
            home.receive(event)
            if case .packet = event { return }
        }
        front.receive(event)
    }

    /// Stops: an active node drains its devices, lets the writer commit, then releases the
    /// lease so that a standby takes over at once. Returns when done.
    public func stop() {
        stopping.store(true, ordering: .releasing)
        let thread = state.withLock { state -> JoinableThread? in
            defer { state.thread = nil }
            return state.thread
        }
        thread?.join()
        front?.link.stop()
    }

    /// Puts a reloaded configuration in force: in the active server now, and in the server
    /// of every later term.
    public func reload(_ configuration: ServerConfiguration) {
        let server = state.withLock { state -> SignalingServer? in
            state.configuration = configuration
            return state.server
        }
        server?.reload(configuration)
    }

    // MARK: Lease thread

    private func run() {
        while !isStopping {
            guard let (acquiredSentAt, frontServer) = waitAsStandby() else { break }
            if !serveTerm(LeaseTerm(ttl: lease.ttl, acquiredSentAt: acquiredSentAt), drainingFirst: frontServer) {
                // A server that cannot start (a port in use, a store it refuses) is not
                // retried at once: another node may do better meanwhile.
                sleep(until: clock.now() + lease.ttl)
            }
        }
    }

    /// The outcome of starting a term's server, handed from the start thread.
    private final class TermStart: Sendable {
        let result = Mutex<Result<SignalingServer, ServerError>?>(nil)
        var isDone: Bool { result.withLock { $0 != nil } }
    }

    private var isStopping: Bool { stopping.load(ordering: .acquiring) }

    /// Waits until this node holds the lease (returns when the successful acquire was
    /// sent, with the front server still running for the term's start to drain) or is
    /// stopped (nil). Serves the standby (or front) admin API meanwhile; a cluster member
    /// serves devices as a front.
    private func waitAsStandby() -> (Instant, SignalingServer?)? {
        let configuration = state.withLock { state -> ServerConfiguration in
            state.role = front == nil ? .standby : .front
            return state.configuration
        }
        var admin: AdminHTTPServer?
        if let settings = configuration.admin {
            let api: StandbyAdminAPI
            if front != nil {
                api = StandbyAdminAPI(
                    token: settings.token, role: .front, readiness: { [weak self] in self?.frontReadiness ?? Readiness() },
                    frontConnections: { [weak self] in
                        self?.state.withLock { $0.frontServer }?.openConnectionsPerLoop.reduce(0, +) ?? 0
                    },
                    frontMetrics: { [weak self] out in self?.state.withLock { $0.frontServer }?.frontMetrics(into: &out) })
            } else {
                api = StandbyAdminAPI(token: settings.token) { [weak self] in self?.state.withLock { $0.standbyReason } ?? "stopped" }
            }
            do {
                let server = try AdminHTTPServer(host: settings.host, port: settings.port, maxBodyBytes: settings.maxBodyBytes, handler: api, logger: logger)
                try server.start()
                admin = server
                logger.info("admin_listening", ["addr": "\(settings.host):\(server.port)", "role": front == nil ? "standby" : "front"])
            } catch {
                // The port may still be held by a server of the last term for a moment.
                logger.warning("standby_admin_failed", ["error": error.description])
            }
        }
        defer { admin?.stop() }
        var logged = ""
        var frontFailure = ""
        while !isStopping {
            if front != nil && state.withLock({ $0.frontServer }) == nil { startFront(configuration, lastFailure: &frontFailure) }
            let sent = clock.now()
            let reason: String
            do {
                if try lease.acquire() { return (sent, state.withLock { $0.frontServer }) }
                let holder = lease.holder()
                // A store that cannot be reached leaves the home as it was: the link,
                // on the same Redis, says whether relaying still works.
                front?.setHome(holder)
                reason = "the store lease is held by \(holder ?? "another node")"
            } catch {
                reason = "cannot reach the store to take its lease: \(error.message)"
            }
            state.withLock { $0.standbyReason = reason }
            if reason != logged {
                logger.info("standby", ["reason": reason, "ttl_ms": lease.ttl.milliseconds])
                logged = reason
            }
            sleep(until: sent + pollInterval)
        }
        let frontServer = state.withLock { $0.frontServer }
        frontServer?.shutdown()
        state.withLock { $0.frontServer = nil }
        return nil
    }

    /// Starts the front server of a cluster member (its own admin API off: the node's
    /// serves the front's role). One that cannot start (the port still held by the
    /// last term's server) is tried again at the next poll; `lastFailure` keeps the log to
    /// one line per distinct error.
    private func startFront(_ configuration: ServerConfiguration, lastFailure: inout String) {
        guard let front else { return }
        var frontConfiguration = configuration
        frontConfiguration.admin = nil
        frontConfiguration.pushGateway = nil
        do {
            let server = try SignalingServer(configuration: frontConfiguration, clock: clock, logger: logger, front: front)
            try server.start()
            state.withLock { $0.frontServer = server }
            logger.info("front", ["listening": server.listeningDescription])
        } catch {
            if error.description != lastFailure {
                logger.warning("front_start_failed", ["error": error.description, "detail": "retrying at every poll"])
                lastFailure = error.description
            }
        }
    }

    /// A front's `/readyz`: listening, and able to relay devices to a home.
    var frontReadiness: Readiness {
        let listening = state.withLock { $0.frontServer?.isRunning ?? false }
        return Readiness(listening: listening, noRoute: front?.unavailableReason)
    }

    /// One active term: starts the server, keeps the lease, and ends by stepping down
    /// (the lease lost) or by a clean stop (the lease released). False when the server
    /// could not start.
    private func serveTerm(_ acquired: LeaseTerm, drainingFirst frontServer: SignalingServer?) -> Bool {
        var term = acquired
        let token = lease.ownerID
        logger.info("lease_acquired", ["node": token, "ttl_ms": lease.ttl.milliseconds])
        let configuration = state.withLock { $0.configuration }
        let started = TermStart()
        let link = front?.link
        let starter = JoinableThread(name: "vs-term-start") { [clock, logger, openStore, weak self] in
            let result: Result<SignalingServer, ServerError>
            // The front's devices go first (CLOSE goingAway): they resume on this node's
            // home server, whose port the front frees.
            if let frontServer {
                frontServer.shutdown()
                self?.state.withLock { $0.frontServer = nil }
            }
            do throws(ServerError) {
                let store: any EventStore
                do throws(StoreError) { store = try openStore(token) } catch { throw ServerError("cannot open the store: \(error)") }
                let server = try SignalingServer(configuration: configuration, clock: clock, logger: logger, store: store)
                if let link {
                    server.enableRelay(over: link)
                    self?.state.withLock { $0.linkedHome = server }
                }
                try server.start()
                // Fronts address the home by the lease owner id, once they hear that it
                // listens (FrontRelay): only now that its loops take what they send.
                link?.listen(as: token)
                result = .success(server)
            } catch {
                result = .failure(error)
            }
            started.result.withLock { $0 = result }
        }
        var server: SignalingServer?
        var lostReason: String?
        while !isStopping {
            if server == nil, let result = started.result.withLock({ $0 }) {
                switch result {
                case .success(let running):
                    server = running
                    state.withLock {
                        $0.server = running
                        $0.role = .active
                    }
                    logger.info("active", ["node": token])
                case .failure(let error):
                    logger.error("term_start_failed", ["error": error.description, "detail": "releasing the lease and waiting as a standby"])
                    lostReason = "the server could not start"
                }
                if lostReason != nil { break }
            }
            let now = clock.now()
            if term.mustStepDown(now: now) {
                lostReason = "the lease could not be refreshed before it could expire (\(lease.ttl.milliseconds) ms TTL)"
                break
            }
            if now >= term.nextRefresh {
                do {
                    if try lease.refresh() {
                        term.refreshed(sentAt: now)
                    } else {
                        // No question to the store before stepping down: who holds it now is logged by the standby.
                        lostReason = "the store lease is no longer this node's (it expired, or another node took it)"
                        break
                    }
                } catch {
                    term.refreshFailed(now: clock.now())
                    logger.warning("lease_refresh_failed", ["error": error.message, "step_down_in_ms": (term.stepDownAt - clock.now()).milliseconds])
                }
                continue
            }
            sleep(until: min(term.nextRefresh, term.stepDownAt), orStarted: server == nil ? started : nil)
        }
        // Stepping down comes first: a server still loading is waited for after that.
        if let server, let lostReason { server.stepDown(reason: lostReason) }
        starter.join()
        if server == nil, case .success(let late)? = started.result.withLock({ $0 }) {
            server = late
            if let lostReason { late.stepDown(reason: lostReason) }
        }
        if lostReason == nil { server?.beginShutdown() }
        server?.waitUntilStopped()
        if let link = front?.link { link.stopListening(as: token) }
        state.withLock {
            $0.server = nil
            $0.linkedHome = nil
            $0.role = .standby
        }
        // Only after the writer stopped: a clean stop's last commits are in. After losing
        // the lease this deletes nothing that is not still ours (owner-checked).
        lease.release()
        if lostReason != nil { logger.info("stepped_down", ["node": token]) }
        return server != nil
    }

    /// Sleeps until `deadline` on the node's clock, in short slices so that a stop (or a
    /// server of the term that finished starting) is noticed at once.
    private func sleep(until deadline: Instant, orStarted started: TermStart? = nil) {
        let real = SystemClock()
        state.withLock { $0.sleepingUntil = deadline }
        defer { state.withLock { $0.sleepingUntil = nil } }
        while !isStopping && clock.now() < deadline {
            if let started, started.isDone { return }
            real.sleep(until: real.now() + min(.milliseconds(10), deadline - clock.now()))
        }
    }
}
