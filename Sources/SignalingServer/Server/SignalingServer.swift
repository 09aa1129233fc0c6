import CLinuxShims
import SignalingCrypto
import SignalingProtocol
import SignalingPush
import SignalingStore
import SignalingSupport
import SignalingTLS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Lock order: `settings` before the locks a reload takes inside it (a routing shard's
// fallback lock, the handshake material's in `ServerContext`); none of those is ever held
// while `settings` is taken. A reload's holds of the routing shards go to their running
// owner loops, which the main thread waits for under `settings`: no loop takes
// `settings`. `state` is never held together with another lock.

/// The signaling server: `workers` event loops on their own threads, each accepting on
/// its own SO_REUSEPORT socket, sharing one routing core.
///
///     let server = try SignalingServer(configuration: configuration)
///     try server.start()          // returns once listening
///     ...
///     server.shutdown()           // CLOSE goingAway to everyone, then stop
public final class SignalingServer: Sendable {
    /// The configuration in force: the one the server started with, with the changes of
    /// every `reload` since.
    public var configuration: ServerConfiguration { settings.withLock { $0 } }
    private let settings: Mutex<ServerConfiguration>
    private let context: ServerContext
    private let writer: StoreWriter?
    private let pushGateway: PushGateway?
    private let state = Mutex<RunState>(RunState())
    /// Set by `beginShutdown`: `/readyz` then answers 503.
    private let draining = Atomic<Bool>(false)
    /// The session-ticket key drawn at start, for a TLS listener whose key lives nowhere
    /// else (`TicketKeySource.perProcess`): every reload reuses it, so tickets survive.
    private let drawnTicketKey: [UInt8]
    /// The routing node's end of relayed connections (`enableRelay`; nil: none). Set before
    /// `start`; a leaf lock held for the copy of a reference.
    private let relayHome = Mutex<RelayHome?>(nil)
    /// Each loop's connection-table capacity, read by `start`. Tests only, set before
    /// `start`: the real one (2^24 slots) is beyond any descriptor limit, and what a full
    /// table does must be testable. Not a configuration knob: nobody has a use for it.
    let connectionSlotsPerLoop = Atomic<Int>(ConnectionTable.maximumSlots)

    private struct RunState: ~Copyable {
        var loops: [EventLoop] = []
        var threads: [JoinableThread] = []
        var port: UInt16 = 0
        var tlsPort: UInt16?
        /// Held from start until the loops have stopped (see `cpuLatencyLimit`).
        var cpuLatencyRequest: CPULatencyRequest?
        /// `threadPlacement`, set once by `start`.
        var threadPlacement: (source: ThreadPlacement.Source, threads: [(thread: String, cpus: String)]) = (.off, [])
        /// The admin HTTP API, when configured (stopped after the loops).
        var admin: AdminHTTPServer?
        var started = false
        var stopped = false
    }

    /// - Parameter store: where events are kept until acknowledged. Nil keeps them in
    ///   memory only (a restart loses them).
    /// - Parameter front: makes this server a front (docs/CLUSTER.md, "Fronts"): its loops
    ///   accept devices and relay their bytes to the home through `front`, and run no
    ///   protocol, no routing, no store and no push gateway of their own.
    public init(
        configuration: ServerConfiguration, clock: any Clock = SystemClock(), logger: Logger = Logger(),
        store: (any EventStore)? = nil, front: FrontRelay? = nil
    ) throws(ServerError) {
        do {
            try configuration.validate()
        } catch {
            throw ServerError(error.message)
        }
        if front != nil && store != nil { throw ServerError("a front keeps no store: the home does") }
        self.settings = Mutex(configuration)
        var pushGateway: PushGateway?
        if var push = configuration.pushGateway, front == nil {
            // A call's push is worth delivering only while the call rings.
            push.callLifetime = configuration.ringTimeout
            do {
                pushGateway = try PushGateway(configuration: push, clock: clock, logger: logger)
            } catch {
                throw ServerError("push gateway: \(error.message)")
            }
        }
        self.pushGateway = pushGateway
        var tlsContext: TLSServerContext?
        do {
            drawnTicketKey = try SecureRandom.bytes(TLSServerContext.ticketKeyLength)
        } catch {
            throw ServerError("cannot draw a session-ticket key: \(error)")
        }
        if let tls = configuration.tls { tlsContext = try Self.makeTLSContext(tls, drawnTicketKey: drawnTicketKey) }
        let context = ServerContext(
            configuration: configuration, clock: clock, logger: logger, journaling: store != nil, pushGateway: pushGateway,
            tokenVerifier: try Authentication.verifier(for: configuration), tlsContext: tlsContext, front: front)
        self.context = context
        context.switchboard.setUp(wall: clock.wallMilliseconds()) { $1.pushRouting = pushGateway?.routing }
        // A token the push service declared invalid is removed from the device and, as a
        // store change, from the store; a device that registered a new token meanwhile
        // keeps it. Runs on the push thread, which waits for the hold (handed to the user's
        // shard's owner loop while it runs): short.
        pushGateway?.onTokenInvalid { [weak context] wakeUp, registration, reason in
            guard let context else { return }
            let removed = context.switchboard.withState(of: wakeUp.userID, wall: context.wallMilliseconds()) {
                $0.removeRejectedPushToken(user: wakeUp.userID, device: wakeUp.deviceID, registration)
            }
            context.logger.info("push_token_removed", [
                "user": wakeUp.userID, "device": wakeUp.deviceID, "kind": registration.kind.rawValue, "reason": reason,
                "removed": removed,
            ])
        }
        guard let store else {
            writer = nil
            return
        }
        // Rebuild what the store kept before any device can connect.
        let snapshot: StoredSnapshot
        do {
            snapshot = try store.loadSnapshot()
        } catch {
            store.close()
            throw ServerError("cannot load the store: \(error)")
        }
        let wall = clock.wallMilliseconds()
        context.switchboard.load(snapshot, now: clock.now(), wall: wall, evictsBodies: store is any EventBodySource)
        // Ids that expired while the server was down: the load skipped them, the writer
        // forgets them in the store (`ExpiredMessageIDSweep`).
        let expiredMessageIDs = snapshot.messageIDs.filter { $0.hasExpired(at: wall) }
        logger.info("store_loaded", [
            "devices": snapshot.devices.count, "pending_events": snapshot.devices.reduce(0) { $0 + $1.events.count },
            "held_events": snapshot.held.values.reduce(0) { $0 + $1.count },
            "message_ids": snapshot.messageIDs.count - expiredMessageIDs.count, "expired_message_ids": expiredMessageIDs.count,
        ])
        let writer = try StoreWriter(store: store, context: context, expiredMessageIDs: expiredMessageIDs)
        context.switchboard.attach(writer)
        self.writer = writer
    }

    /// Binds the listening sockets and starts the loops. Returns once the server accepts and
    /// each loop owns its routing shard.
    public func start() throws(ServerError) {
        try start(allowedCPUs: CPUList.allowed())
    }

    /// `start`, placing threads as if the process could use `allowedCPUs` (tests: CPUs the
    /// machine lacks, so that the kernel refuses the placement).
    func start(allowedCPUs: [Int]) throws(ServerError) {
        // libevent's HTTP code (the push gateway's requests, the admin API's responses)
        // writes with writev(2), which raises SIGPIPE when the peer has gone: that would kill
        // the whole process. The device loops send with MSG_NOSIGNAL; for the rest the
        // process ignores SIGPIPE, as voipserver's main does (an embedding app must not
        // rely on SIGPIPE either).
        signal(SIGPIPE, SIG_IGN)
        // Threads start below (the push gateway's, the loops, the store writer, the admin
        // API): from here on the routing state is reached through its owners or its locks.
        context.switchboard.share()
        let configuration = self.configuration
        let loopCPUs = configuration.loopCPUs
        if let missing = loopCPUs.first(where: { $0 >= CPUList.configuredCount }) {
            throw ServerError("--loop-cpus: there is no CPU \(missing) (this machine has \(CPUList.configuredCount): 0-\(CPUList.configuredCount - 1))")
        }
        if let pushGateway {
            do {
                try pushGateway.start()
            } catch {
                throw ServerError("push gateway: \(error)")
            }
        }
        let relay = relayHome.withLock { $0 }
        var loops: [EventLoop] = []
        var port = configuration.plainListener ? configuration.port : 0
        var tlsPort = configuration.tls?.port ?? 0
        var errorText = [CChar](repeating: 0, count: 256)
        func lastError() -> String {
            String(decoding: errorText.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        for (host, fixedPort) in listenerAddresses(configuration) where fixedPort != 0 {
            if shim_port_is_free(host, fixedPort, &errorText, errorText.count) == 0 {
                throw ServerError(lastError() + " (is another voipserver running?)")
            }
        }
        /// One listening socket; the first of each listener may pick the port (port 0),
        /// the other loops' sockets join it (SO_REUSEPORT).
        func listenSocket(_ host: String, _ port: UInt16) throws(ServerError) -> Int32 {
            let fd = shim_listen_tcp(host, port, 1, Int32(configuration.listenBacklog), &errorText, errorText.count)
            guard fd >= 0 else {
                for loop in loops { loop.stopListening() }
                throw ServerError(lastError())
            }
            return fd
        }
        for index in 0..<configuration.workers {
            let fd = configuration.plainListener ? try listenSocket(configuration.host, port) : -1
            var tlsFD: Int32 = -1
            if let tls = configuration.tls {
                do {
                    tlsFD = try listenSocket(tls.host, tlsPort)
                } catch {
                    if fd >= 0 { close(fd) }
                    throw error
                }
            }
            if index == 0 {
                if fd >= 0 { port = UInt16(shim_local_port(fd)) }
                if tlsFD >= 0 { tlsPort = UInt16(shim_local_port(tlsFD)) }
            }
            do {
                loops.append(try EventLoop(
                    index: UInt16(index), context: context, listenFD: fd, tlsListenFD: tlsFD, relay: relay,
                    connectionSlots: connectionSlotsPerLoop.load(ordering: .relaxed)))
            } catch {
                for descriptor in [fd, tlsFD] where descriptor >= 0 { close(descriptor) }
                for loop in loops { loop.stopListening() }
                throw error
            }
        }
        for loop in loops { loop.peers = loops }
        relay?.attach(loops)
        context.front?.attach(loops)
        if let writer {
            writer.loops = loops
            writer.start()
            // Before the loops run: loop 0 owns the threads' policy from its first tick.
            if configuration.storeThreadPriority == .auto {
                let refusal = writer.lowerThreadPriority()
                context.logger.info("store_thread_priority", [
                    "priority": refusal == nil ? "idle" : "normal",
                    "detail": refusal ?? "the store's threads run at the idle policy while they keep up, at the normal one while they fall behind",
                ])
            }
        }

        let cpuLatencyRequest = requestCPULatencyLimit()
        let threads = loops.map { loop in JoinableThread(name: "vs-loop-\(loop.index)") { loop.run() } }
        let loopSlice = askLoopSlice(threads)
        let loopRealtime = askLoopRealtime(threads)
        // Each loop claims its shard as its thread starts: until then another thread's hold
        // (an admin call, a test) would take the shard's fallback lock. Microseconds.
        _ = Self.poll(every: 100, for: .seconds(10)) { loops.allSatisfy { $0.runsOwned || $0.finished.load(ordering: .acquiring) } }
        state.withLock {
            $0.cpuLatencyRequest = cpuLatencyRequest
            $0.loops = loops
            $0.threads = threads
            $0.port = port
            $0.tlsPort = configuration.tls == nil ? nil : tlsPort
            $0.started = true
        }
        let placement: ThreadPlacement
        do {
            placement = try placeThreads(threads, allowedCPUs: allowedCPUs)
        } catch {
            shutdown()
            throw error
        }
        if let admin = configuration.admin {
            do {
                try startAdmin(admin, loops: loops)
            } catch {
                shutdown()
                throw error
            }
        }
        if !configuration.requiresAuthentication {
            context.logger.warning("auth_disabled", [
                "detail": listenerAddresses(configuration).allSatisfy { ServerConfiguration.isLoopback($0.host) }
                    ? "no --auth-key-file: any device may claim any user id, so only this host may connect (loopback only)"
                    : "no --auth-key-file and --allow-anonymous: any device on the network may claim any user id",
            ])
        }
        let tls = configuration.tls
        context.logger.info("listening", [
            "addr": configuration.plainListener ? "\(configuration.host):\(port)" : "off",
            "tls_addr": tls.map { "\($0.host):\(tlsPort)" } ?? "off", "version": ProductVersion.current,
            "workers": configuration.workers,
            "backlog": configuration.listenBacklog,
            "keepalive": configuration.keepAlive.defaultInterval,
            "auth": Self.authenticationSummary(configuration), "proxy_protocol": configuration.proxyProtocol ? "v2" : "off",
            "tls_proxy_protocol": tls?.proxyProtocol == true ? "v2" : "off",
            "cpu_latency_limit": cpuLatencyRequest.map { "\($0.microseconds)us" } ?? "none",
            "loop_cpus": placement.loops.isEmpty ? "any" : placement.loops.map(String.init).joined(separator: ","),
            "loop_slice": loopSlice, "loop_realtime": loopRealtime,
        ])
        if let tls, let tlsContext = context.tlsContext { logTLSCertificate(tls, tlsContext) }
    }

    /// Asks the scheduler for `--loop-slice` on each loop's thread. Returns what the
    /// `listening` line reports: the slice, or `default`. A kernel that keeps no slice per
    /// thread (before Linux 6.12) or a refusal logs one warning, `loop_slice_ignored`.
    private func askLoopSlice(_ loops: [JoinableThread]) -> String {
        let slice = configuration.loopSlice
        guard slice > .zero else { return "default" }
        let refusal = loops.lazy.map { $0.setSlice(slice) }.first { $0 != 0 }
        guard let refusal else {
            if JoinableThread.keepsSlicePerThread { return "\(slice.microseconds)us" }
            context.logger.warning("loop_slice_ignored", ["detail": "this kernel keeps no scheduler slice per thread (Linux 6.12 and later do)"])
            return "default"
        }
        context.logger.warning("loop_slice_ignored", ["detail": SystemError("sched_setattr", refusal).reason])
        return "default"
    }

    /// Finds whether the loops may run under `SCHED_FIFO` at `--loop-realtime`'s priority
    /// (each thread moved there and straight back) and, if so, hands their threads to loop
    /// 0's supervision (`LoopPriorityControl`), which raises them once connections are not
    /// ramping and no loop is saturated. Returns what the `listening` line reports: the
    /// priority, or `off`. Refused (no CAP_SYS_NICE or RLIMIT_RTPRIO), `auto` says why in
    /// the `loop_realtime` line and a priority given outright logs one warning,
    /// `loop_realtime_ignored`; either way the loops stay at the normal policy.
    private func askLoopRealtime(_ loops: [JoinableThread]) -> String {
        guard let control = context.loopPriority else {
            if configuration.loopRealtime == .auto {
                context.logger.info("loop_realtime", ["priority": "off", "detail": "--busy-poll: a polling loop at a real-time priority would keep its CPU from every other thread"])
            }
            return "off"
        }
        let refusal = loops.lazy.map { $0.setRealtime(priority: control.priority) }.first { $0 != 0 }
        for loop in loops { _ = loop.setRealtime(priority: 0) }
        if let refusal {
            let reason = SystemError("pthread_setschedparam", refusal).reason
            if configuration.loopRealtime == .auto {
                context.logger.info("loop_realtime", ["priority": "off", "detail": "not permitted (needs CAP_SYS_NICE or LimitRTPRIO=1): \(reason)"])
            } else {
                context.logger.warning("loop_realtime_ignored", ["detail": reason])
            }
            return "off"
        }
        control.control(loops)
        context.logger.info("loop_realtime", [
            "priority": control.priority,
            "detail": "the loops run under SCHED_FIFO once connections stop ramping, while none is saturated and while the hypervisor steals under 1 % of the host's CPU time (a minute after it last did); at the normal policy until then",
        ])
        return "\(control.priority)"
    }

    /// Gives the loops and the store's threads their CPUs (`ThreadPlacement`) and logs
    /// `thread_placement`. Loop *i* on its own CPU keeps its caches, and the store's bursts
    /// of work (group commits, checkpoints) never take the CPU the loop is about to wake
    /// on. A refused `--loop-cpus` stops the start (the operator asked for exactly that); a
    /// refused automatic placement logs one warning, `thread_placement_refused`, and every
    /// thread runs where the scheduler puts it.
    private func placeThreads(_ loops: [JoinableThread], allowedCPUs: [Int]) throws(ServerError) -> ThreadPlacement {
        let configuration = self.configuration
        var placement = ThreadPlacement.plan(
            mode: configuration.threadPlacement, loopCPUs: configuration.loopCPUs, allowed: allowedCPUs,
            loops: loops.count, durableStore: writer != nil)
        let storeThreads = writer?.threads ?? []
        let assignments = zip(loops, placement.loops).map { (thread: $0, cpus: [$1]) }
            + (placement.store.isEmpty ? [] : storeThreads.map { (thread: $0, cpus: placement.store) })
        if let refusal = ThreadPlacement.pin(assignments) {
            let reason = SystemError("pthread_setaffinity_np", refusal.error).reason
            let cpus = CPUList.format(refusal.cpus)
            guard placement.source != .loopCPUs else {
                throw ServerError("--loop-cpus: cannot run \(refusal.thread) on CPU \(cpus): \(reason)")
            }
            placement = ThreadPlacement(source: .refused, loops: [], store: [], detail: "\(refusal.thread) on CPU \(cpus): \(reason)")
            context.logger.warning("thread_placement_refused", [
                "thread": refusal.thread, "cpus": cpus, "error": reason,
                "detail": "the kernel refused the automatic placement; every thread runs where the scheduler puts it (--thread-placement off: no attempt)",
            ])
        }
        let threads = placement.threads(loopCount: loops.count, storeThreads: storeThreads.map { $0.name ?? "store" })
        let described = threads.map { "\($0.thread):\($0.cpus)" }.joined(separator: ",")
        context.logger.info("thread_placement", [
            "placement": placement.source.rawValue, "threads": described, "allowed_cpus": CPUList.format(allowedCPUs),
            "detail": placement.detail ?? "-",
        ])
        state.withLock { $0.threadPlacement = (placement.source, threads) }
        return placement
    }

    /// The placement in force (`thread_placement`): how it was decided, and each placed
    /// thread's CPUs (`any`: where the scheduler puts it). Empty threads before `start`.
    var threadPlacement: (source: ThreadPlacement.Source, threads: [(thread: String, cpus: String)]) {
        state.withLock { $0.threadPlacement }
    }

    /// Whether each of the store's threads (the writer first) runs at the idle policy now,
    /// read from the kernel (tests; nil: gone). Empty without a store.
    var storeThreadsAtIdlePriority: [Bool?] { writer?.threads.map(\.runsAtIdlePriority) ?? [] }

    /// What `/metrics` says of the store's threads' policy: at idle now, and how many times
    /// loop 0 raised them (tests).
    var storeThreadPriorityCounts: (idle: Bool, raises: Int, raisesToNormal: Int) {
        (writer?.threadsAtIdlePriority.load(ordering: .relaxed) ?? false, writer?.threadPriorityRaises.load(ordering: .relaxed) ?? 0,
         writer?.threadPriorityRaisesToNormal.load(ordering: .relaxed) ?? 0)
    }

    /// The store's threads' policies and nice values now, read from the kernel (tests).
    var storeThreadPriorities: [SchedulingPriority?] { writer?.threads.map(\.priority) ?? [] }

    /// Each loop thread's scheduler slice now (asked for, or the default), read from the kernel (tests).
    var loopThreadSlices: [Duration?] { state.withLock { $0.threads }.map(\.slice) }
    /// Each loop thread's `SCHED_FIFO` priority (0: the normal policy; nil: gone).
    var loopThreadRealtimePriorities: [Int32?] { state.withLock { $0.threads }.map(\.realtimePriority) }

    /// The loops' moves to `SCHED_FIFO` and back, by reason (tests; nil: `--loop-realtime`
    /// off, or `auto` with `--busy-poll`).
    var loopRealtimeChanges: (raises: Int, loweredForRamp: Int, loweredSaturated: Int, loweredForSteal: Int)? {
        context.loopPriority.map {
            (
                $0.raises.load(ordering: .relaxed), $0.loweredForRamp.load(ordering: .relaxed), $0.loweredSaturated.load(ordering: .relaxed),
                $0.loweredForSteal.load(ordering: .relaxed)
            )
        }
    }

    /// The CPUs each loop thread may run on now, read from the kernel (tests).
    var loopThreadCPUs: [[Int]] { state.withLock { $0.threads }.map(\.allowedCPUs) }

    /// The addresses of the listeners configured (plain, then TLS), ports as configured.
    private func listenerAddresses(_ configuration: ServerConfiguration) -> [(host: String, port: UInt16)] {
        (configuration.plainListener ? [(configuration.host, configuration.port)] : [])
            + (configuration.tls.map { [($0.host, $0.port)] } ?? [])
    }

    /// Loads the TLS listener's certificate, key and ticket key into a new context (at start
    /// and on each reload, off the loops).
    private static func makeTLSContext(_ tls: TLSListenerConfiguration, drawnTicketKey: [UInt8]) throws(ServerError) -> TLSServerContext {
        let ticketKey = try tls.ticketKey.load(drawn: drawnTicketKey)
        do {
            return try TLSServerContext(
                certificateChainFile: tls.certificateChainFile, privateKeyFile: tls.privateKeyFile,
                minimumVersion: tls.minimumVersion, ticketKey: ticketKey)
        } catch {
            throw ServerError("TLS: \(error.message)")
        }
    }

    /// The `tls_certificate` line: which certificate new TLS connections get (at start and
    /// after each reload), and when it expires.
    private func logTLSCertificate(_ tls: TLSListenerConfiguration, _ tlsContext: TLSServerContext) {
        let ticketKey: String
        switch tls.ticketKey {
        case .file(let path), .dataDirectory(let path): ticketKey = path
        case .perProcess: ticketKey = "per-process"
        }
        context.logger.info("tls_certificate", [
            "cert": tls.certificateChainFile,
            "not_after": tlsContext.certificateNotAfter.map { Logger.timestamp(UInt64(max(0, $0)) * 1000) } ?? "unknown",
            "min_version": tls.minimumVersion.rawValue, "ticket_key": ticketKey,
        ])
    }

    /// What a `reload` did, by option name (docs/CONFIGURATION.md).
    public struct Reload: Sendable, Equatable {
        /// Settings whose new values are now in force.
        public var applied: [String] = []
        /// Settings that differ from the running ones but take effect only at the next
        /// start; the running values stay.
        public var needRestart: [String] = []

        public init(applied: [String] = [], needRestart: [String] = []) {
            self.applied = applied
            self.needRestart = needRestart
        }
    }

    /// The settings `reload` puts in force while the server runs. Each is read where it is
    /// used (a handshake, an accept, a message) from a lock or an atomic, so a change is
    /// seen by the next operation of every loop. Everything else (addresses, threads,
    /// timer lengths whose queues rely on one constant length, the store, buffers) is
    /// fixed at start.
    public static let reloadableSettings = [
        "log-level", "auth-key-file", "auth-secret", "max-pending", "max-connections-per-ip", "handshake-rate",
        "tls-cert", "tls-key", "tls-min-version", "tls-ticket-key-file",
        "apns-key-file", "apns-key-id", "apns-team-id", "fcm-service-account",
    ]

    /// The `auth` field of the `listening` line: `tokens(k1,k2)`, `legacy`, both, or `off`.
    static func authenticationSummary(_ configuration: ServerConfiguration) -> String {
        var parts: [String] = []
        if !configuration.authKeys.isEmpty { parts.append("tokens(\(configuration.authKeys.map(\.id).joined(separator: ",")))") }
        if configuration.authSecret != nil { parts.append("legacy") }
        return parts.isEmpty ? "off" : parts.joined(separator: "+")
    }

    /// Puts the reloadable settings of `new` in force and reports, without applying them,
    /// the others that differ. Logs `reloaded` (info) with the keys, and
    /// `reload_needs_restart` (warn) when some keys cannot change now. Connections already
    /// open stay, whatever the new limits; a device that authenticated with the old secret
    /// keeps its connection until it reconnects.
    @discardableResult
    public func reload(_ new: ServerConfiguration) -> Reload {
        let now = context.now()
        return settings.withLock { current -> Reload in
            var result = Reload()
            if new.logLevel != current.logLevel {
                context.logger.level = new.logLevel
                result.applied.append("log-level")
            }
            let authChanged = new.authKeys != current.authKeys || new.authSecret != current.authSecret
            var authApplied = false
            if authChanged && !new.requiresAuthentication && !new.allowAnonymous && !ServerConfiguration.isLoopback(current.host) {
                // The listener stays where it is until a restart: dropping authentication on
                // it would open it to the network, which the start refuses too.
                context.logger.error("reload_refused", [
                    "keys": "auth-key-file,auth-secret",
                    "detail": "the reloaded configuration has no authentication but the server listens on \(current.host); the running keys stay",
                ])
            } else if authChanged {
                do {
                    context.tokenVerifier = try Authentication.verifier(for: new)
                    authApplied = true
                    if new.authKeys != current.authKeys { result.applied.append("auth-key-file") }
                    if new.authSecret != current.authSecret { result.applied.append("auth-secret") }
                } catch {
                    context.logger.error("reload_refused", ["keys": "auth-key-file,auth-secret", "detail": "\(error)"])
                }
            }
            // The routing core's limits, in one switch under its lock.
            let limits: [(name: String, changed: Bool)] = [
                ("max-pending", new.maxPendingEvents != current.maxPendingEvents),
                ("max-pending-per-sender", new.maxPendingPerSender != current.maxPendingPerSender),
                ("sender-rate", new.senderRate != current.senderRate),
                ("memory-budget", new.memoryBudget != current.memoryBudget),
            ]
            if limits.contains(where: \.changed) {
                let routing = new.switchboard
                context.switchboard.forEachShard(wall: context.wallMilliseconds()) { $0.applyLimits(of: routing) }
                result.applied += limits.filter(\.changed).map(\.name)
            }
            if new.maxConnectionsPerAddress != current.maxConnectionsPerAddress || new.handshakeRate != current.handshakeRate {
                context.admission.update(
                    maxConnectionsPerAddress: new.maxConnectionsPerAddress, handshakeRate: new.handshakeRate, now: now)
                if new.maxConnectionsPerAddress != current.maxConnectionsPerAddress { result.applied.append("max-connections-per-ip") }
                if new.handshakeRate != current.handshakeRate { result.applied.append("handshake-rate") }
            }
            if let running = current.tls, let wanted = new.tls {
                // The files are read again whatever their names: a renewed certificate
                // usually replaces the old one in place. New connections get the new
                // context; open ones keep theirs.
                do {
                    let fresh = try Self.makeTLSContext(wanted, drawnTicketKey: drawnTicketKey)
                    context.tlsContext = fresh
                    result.applied += ["tls-cert", "tls-key"]
                    if wanted.minimumVersion != running.minimumVersion { result.applied.append("tls-min-version") }
                    if wanted.ticketKey != running.ticketKey { result.applied.append("tls-ticket-key-file") }
                    current.tls?.certificateChainFile = wanted.certificateChainFile
                    current.tls?.privateKeyFile = wanted.privateKeyFile
                    current.tls?.minimumVersion = wanted.minimumVersion
                    current.tls?.ticketKey = wanted.ticketKey
                    logTLSCertificate(wanted, fresh)
                } catch {
                    context.logger.error("reload_refused", [
                        "keys": "tls-cert,tls-key,tls-min-version,tls-ticket-key-file",
                        "detail": "\(error); new TLS connections keep getting the running certificate",
                    ])
                }
            }
            if let pushGateway, let running = current.pushGateway {
                result.applied += reloadPushCredentials(pushGateway, running: running, new, into: &current)
            }
            current.logLevel = new.logLevel
            if authApplied {
                current.authKeys = new.authKeys
                current.authSecret = new.authSecret
            }
            current.maxPendingEvents = new.maxPendingEvents
            current.maxPendingPerSender = new.maxPendingPerSender
            current.senderRate = new.senderRate
            current.memoryBudget = new.memoryBudget
            current.maxConnectionsPerAddress = new.maxConnectionsPerAddress
            current.handshakeRate = new.handshakeRate
            // The push services' other settings are compared with the credentials in force.
            var comparable = new
            if let apns = current.pushGateway?.apns { comparable.pushGateway?.apns = new.pushGateway?.apns?.withCredentials(of: apns) }
            if let fcm = current.pushGateway?.fcm { comparable.pushGateway?.fcm = new.pushGateway?.fcm?.withCredentials(of: fcm) }
            result.needRestart = Self.restartOnlySettings.filter { $0.value(current) != $0.value(comparable) }.map(\.name)

            context.logger.info("reloaded", ["changed": result.applied.isEmpty ? "none" : result.applied.joined(separator: ",")])
            if !result.needRestart.isEmpty {
                context.logger.warning("reload_needs_restart", [
                    "keys": result.needRestart.joined(separator: ","),
                    "detail": "these settings changed but take effect only when the server is restarted",
                ])
            }
            if authApplied {
                context.logger.info("auth_keys", ["auth": Self.authenticationSummary(new)])
                if !new.requiresAuthentication {
                    context.logger.warning("auth_disabled", ["detail": "the reloaded configuration has no authentication: any device may claim any user id"])
                }
            }
            return result
        }
    }

    /// Hands the push services' reloaded signing material to the gateway when it differs
    /// from the running one (a new APNs key also means a new provider token, and Apple
    /// refuses more than one of those per 20 minutes, so an unchanged key is left alone).
    /// A file the reload could not read keeps the running material: `reload_refused`.
    /// Returns the settings applied; records them in `current`.
    private func reloadPushCredentials(
        _ gateway: PushGateway, running: PushGatewayConfiguration, _ new: ServerConfiguration, into current: inout ServerConfiguration
    ) -> [String] {
        for refusal in new.refusedPushCredentials {
            context.logger.error("reload_refused", ["keys": refusal.option, "detail": "\(refusal.detail); the running key stays"])
        }
        let apns = running.apns.flatMap { old in new.pushGateway?.apns.flatMap { $0.credentialsDiffer(from: old) ? $0 : nil } }
        let fcm = running.fcm.flatMap { old in new.pushGateway?.fcm.flatMap { $0.credentialsDiffer(from: old) ? $0 : nil } }
        guard apns != nil || fcm != nil else { return [] }
        do {
            try gateway.replaceCredentials(apns: apns, fcm: fcm)
        } catch {
            context.logger.error("reload_refused", ["keys": "apns-key-file,fcm-service-account", "detail": "\(error.message); the running keys stay"])
            return []
        }
        var applied: [String] = []
        if let apns, let old = running.apns {
            applied.append("apns-key-file")
            if apns.keyID != old.keyID { applied.append("apns-key-id") }
            if apns.teamID != old.teamID { applied.append("apns-team-id") }
            current.pushGateway?.apns = old.withCredentials(of: apns)
        }
        if let fcm, let old = running.fcm {
            applied.append("fcm-service-account")
            current.pushGateway?.fcm = old.withCredentials(of: fcm)
        }
        return applied
    }

    /// Every other setting, as text to compare: what a reload reports but cannot change.
    private static let restartOnlySettings: [(name: String, value: @Sendable (ServerConfiguration) -> String)] = [
        ("listen", { $0.plainListener ? "\($0.host):\($0.port)" : "off" }), ("listen-backlog", { "\($0.listenBacklog)" }),
        ("tls-listen", { $0.tls.map { "\($0.host):\($0.port)" } ?? "off" }),
        ("tls-proxy-protocol", { "\($0.tls?.proxyProtocol ?? false)" }),
        ("workers", { "\($0.workers)" }), ("keepalive", { "\($0.keepAlive.defaultInterval)" }),
        ("max-keepalive", { "\($0.keepAlive.maximumInterval)" }), ("ring-timeout", { "\($0.ringTimeout)" }),
        ("call-grace", { "\($0.callGrace)" }), ("max-frame", { "\($0.maxFrameLength)" }),
        ("handshake-timeout", { "\($0.handshakeTimeout)" }), ("session-ttl", { "\($0.sessionTTL)" }),
        ("event-ttl", { "\($0.eventTTL)" }), ("dedup-window", { "\($0.dedupWindow)" }),
        ("dedup-capacity", { "\($0.dedupCapacity)" }), ("max-queued-bytes", { "\($0.maxQueuedBytes)" }),
        ("drain-retry-after", { "\($0.drainRetryAfter)" }), ("drain-jitter", { "\($0.drainJitter)" }),
        ("drain-timeout", { "\($0.drainTimeout)" }), ("tick", { "\($0.tickInterval)" }),
        ("tcp-user-timeout", { "\($0.tcpUserTimeout)" }), ("busy-poll", { "\($0.busyPoll)" }), ("loop-slice", { "\($0.loopSlice)" }), ("loop-realtime", { "\($0.loopRealtime)" }),
        ("cpu-latency-limit", { "\(String(describing: $0.cpuLatencyLimit))" }), ("loop-cpus", { "\($0.loopCPUs)" }),
        ("thread-placement", { $0.threadPlacement.rawValue }), ("store-thread-priority", { $0.storeThreadPriority.rawValue }),
        ("push-gateway", { "\(String(describing: $0.pushGateway))" }), ("stats-interval", { "\($0.statsInterval)" }),
        ("store", { "\($0.storage.mode) \($0.storage.redisURL ?? "")" }), ("data-dir", { $0.storage.directory }),
        ("redis-fsync", { "\($0.storage.redisFsync)" }), ("redis-lease-ttl", { "\($0.storage.redisLeaseTTL)" }), ("redis-allow-volatile", { "\($0.storage.redisAllowVolatile)" }),
        ("cluster", { "\($0.storage.cluster)" }),
        ("sync", { "\($0.storage.synchronous)" }), ("store-max-bytes", { "\(String(describing: $0.storage.maxBytes))" }),
        ("store-timeout", { "\($0.storeTimeout)" }), ("delivery", { "\($0.delivery)" }),
        ("commit-interval", { "\($0.commitInterval)" }),
        ("slow-consumer-timeout", { "\($0.slowConsumerTimeout)" }),
        ("log-format", { $0.logFormat.rawValue }), ("admin-listen", { $0.admin.map { "\($0.host):\($0.port)" } ?? "off" }),
        ("admin-token-file", { $0.admin?.token ?? "" }), ("proxy-protocol", { "\($0.proxyProtocol)" }),
    ]

    /// Opens the configured PM QoS request. A host that does not allow it (no root, no
    /// such device) costs latency, not correctness: the server warns and runs anyway.
    private func requestCPULatencyLimit() -> CPULatencyRequest? {
        guard let limit = configuration.cpuLatencyLimit else { return nil }
        let microseconds = Int32(clamping: limit.microseconds)
        do {
            return try CPULatencyRequest(microseconds: microseconds)
        } catch {
            context.logger.warning("cpu_latency_limit_unavailable", [
                "error": error.description, "requested_us": microseconds,
                "detail": "CPUs keep the host's idle policy; run as root or use tuned's latency-performance profile",
            ])
            return nil
        }
    }

    /// The port the plain listener listens on (useful with port 0); 0 when it is off.
    public var port: UInt16 { state.withLock { $0.port } }

    /// Where devices connect, for a status line: `127.0.0.1:7443`, `0.0.0.0:8443 (TLS)`, or both.
    public var listeningDescription: String {
        let configuration = self.configuration
        let (port, tlsPort) = state.withLock { ($0.port, $0.tlsPort) }
        let plain = configuration.plainListener ? ["\(configuration.host):\(port)"] : []
        let tls = zip(configuration.tls.map { [$0.host] } ?? [], tlsPort.map { [$0] } ?? []).map { "\($0):\($1) (TLS)" }
        return (plain + tls).joined(separator: " and ")
    }

    /// The port the TLS listener listens on (nil: no TLS listener).
    public var tlsPort: UInt16? { state.withLock { $0.tlsPort } }

    /// The port the admin API listens on (nil: no admin API).
    public var adminPort: UInt16? { state.withLock { $0.admin?.port } }

    /// Starts the admin HTTP API on its own thread (docs/ADMIN-API.md).
    private func startAdmin(_ admin: AdminConfiguration, loops: [EventLoop]) throws(ServerError) {
        let api = AdminAPI(
            context: context, writer: writer, pushGateway: pushGateway, loops: loops, token: admin.token,
            threadPlacement: threadPlacement,
            readiness: { [weak self] in self?.readiness ?? Readiness() })
        let server = try AdminHTTPServer(
            host: admin.host, port: admin.port, maxBodyBytes: admin.maxBodyBytes, handler: api, logger: context.logger)
        try server.start()
        state.withLock { $0.admin = server }
        context.logger.info("admin_listening", [
            "addr": "\(admin.host):\(server.port)", "auth": admin.token == nil ? "none" : "bearer",
        ])
        if admin.token == nil {
            context.logger.warning("admin_unauthenticated", [
                "detail": "no --admin-token-file: the admin API accepts anyone who can reach \(admin.host), so it listens on loopback only",
            ])
        }
    }

    /// What `/readyz` reports.
    var readiness: Readiness {
        let (listening, loops) = state.withLock { ($0.started && !$0.stopped, $0.loops) }
        return Readiness(
            listening: listening && loops.allSatisfy { !$0.finished.load(ordering: .acquiring) },
            draining: draining.load(ordering: .relaxed), storeHealthy: writer?.isHealthy ?? true,
            leaseLost: writer?.isFenced ?? false, noRoute: context.front?.unavailableReason)
    }

    /// The node lost its lease on the store (docs/CLUSTER.md): it stops acting as the
    /// store's owner at once. New messages and calls are refused (storeUnavailable, the
    /// writer is fenced), `/readyz` turns 503, and the drain begins: every device gets
    /// CLOSE goingAway with the reconnect advice and resumes on the node that takes over.
    /// Returns at once; `waitUntilStopped()` waits for the loops.
    public func stepDown(reason: String) {
        writer?.fence()
        context.logger.error("lease_lost", ["reason": reason, "detail": "refusing sends and closing every device; stepping down to standby"])
        beginShutdown()
    }

    /// Makes this server serve relayed connections (docs/CLUSTER.md, "Relayed connections
    /// (home side)"): devices whose sockets a front node holds, whose bytes arrive over
    /// `link` (`receive`) and whose answers go back over it to the front that relayed them.
    /// The protocol runs over them as over a socket of this server's. Call before `start()`;
    /// the caller starts the link and hands this server its events (`receive`).
    public func enableRelay(over link: any NodeLink) {
        relayHome.withLock { $0 = RelayHome(link: link, context: context) }
    }

    /// An event of the node link given to `enableRelay`, on the link's thread, while this
    /// server routes. Never blocks: packets are decoded and their frames posted to the loops
    /// that have their connections. A packet that cannot be decoded is logged (a line a
    /// second at most) and dropped. The link's `.down` closes every relayed connection; a
    /// front's `.reset`, or its `.undeliverable` or `.gone`, closes that front's (their
    /// devices are offline: events are kept, push wake-ups sent).
    public func receive(_ event: NodeLinkEvent) {
        relayHome.withLock { $0 }?.receive(event)
    }

    /// Drains and stops: every client gets CLOSE goingAway with the configured reconnect
    /// advice, then the loops exit once their clients have closed (or `drainTimeout` has
    /// passed). Returns when every loop thread has finished.
    public func shutdown() {
        beginShutdown()
        waitUntilStopped()
    }

    /// Starts the drain and returns at once; see `shutdown()`.
    public func beginShutdown() {
        let loops = state.withLock { $0.loops }
        draining.store(true, ordering: .relaxed)
        context.logger.info("draining", ["connections": statistics.openConnections])
        for loop in loops { loop.post(.drain) }
    }

    /// True until every loop has exited.
    public var isRunning: Bool {
        state.withLock { $0.loops }.contains { !$0.finished.load(ordering: .acquiring) }
    }

    /// Blocks until every loop has exited (after `shutdown`, from another thread).
    public func waitUntilStopped() {
        let threads = state.withLock { state -> [JoinableThread] in
            defer { state.threads = [] }
            return state.threads
        }
        for thread in threads { thread.join() }
        if !threads.isEmpty {
            context.front?.detach()
            state.withLock { $0.admin }?.stop()
            writer?.stop()
            pushGateway?.stop()
            state.withLock { $0.cpuLatencyRequest = nil }  // closes the request
        }
        let wasStopped = state.withLock { state -> Bool in
            defer { state.stopped = true }
            return state.stopped
        }
        if !threads.isEmpty && !wasStopped { context.logger.info("stopped") }
    }

    public var statistics: ServerStatistics {
        var statistics = context.counters.snapshot(context.switchboard.counters, eventBytes: context.switchboard.eventBytes)
        statistics.storeHealthy = writer?.isHealthy ?? true
        return statistics
    }

    /// A front's families in its node's `/metrics` (`StandbyAdminAPI`; a front runs no
    /// `AdminAPI` of its own): the connections it relays to the home by how the device
    /// reached it, and its listeners' socket and TLS families, named as on the home.
    func frontMetrics(into out: inout PrometheusText) {
        let counters = context.counters
        out.family("voipserver_front_relayed_connections", .gauge, "Device connections a front relays to the home (announced to it, not ended), by how the device reached the front: plain TCP or TLS.")
        AdminAPI.sampleByTransport(
            "voipserver_front_relayed_connections", all: counters.relayedConnections.value, tls: counters.relayedTLSConnections.value, into: &out)
        AdminAPI.socketMetrics(context, loops: state.withLock { $0.loops }, into: &out)
    }

    /// How many times a thread that is not an event loop (the store writer, the admin API,
    /// start-up) has held a routing shard itself, under its fallback lock: for tests.
    var routingLockHoldsOffLoops: UInt64 { context.switchboard.otherThreadHolds.snapshot().count }

    /// How many holds of this server's routing shards took their fallback lock, by its
    /// loops and by other threads (`routing_shard` in `voipserver_lock_hold_seconds`
    /// counts the latter for every server of the process): for tests.
    var routingShardLockHolds: UInt64 {
        eventLoops.reduce(routingLockHoldsOffLoops) { $0 + $1.metrics.lockHolds.snapshot(.routingShard).count }
    }

    /// The routing core (for tests).
    var switchboard: Switchboard { context.switchboard }

    /// How many holds of a routing shard other threads handed to its running owner: for tests.
    var routingShardHandOffs: Int { context.switchboard.handedToOwner.load(ordering: .relaxed) }

    /// The push gateway's counters (nil without a gateway).
    public var pushStatistics: PushStatistics? { pushGateway?.statistics }

    /// How many shards the routing state is split into (docs/ARCHITECTURE.md, "Routing shards").
    public var routingShards: Int { context.switchboard.shardCount }

    /// The event loops, loop 0 first (for tests).
    var eventLoops: [EventLoop] { state.withLock { $0.loops } }

    /// The connections each loop holds open, loop 0 first: how the kernel spread them
    /// (`SO_REUSEPORT`). For tests and tools.
    public var openConnectionsPerLoop: [Int] {
        state.withLock { $0.loops }.map { $0.openConnections.load(ordering: .relaxed) }
    }

    /// The connections each loop accepted and handed over to their user's home loop once
    /// their HELLO was verified, loop 0 first (docs/ARCHITECTURE.md, "Where a connection
    /// lives"). For tests and tools.
    public var connectionsMovedPerLoop: [UInt64] {
        state.withLock { $0.loops }.map { $0.metrics.connectionsMoved.value }
    }

    /// Entries in the loops' idle-timeout wheels, stale ones included (for tests: the
    /// wheel keeps at most one per connection slot).
    var idleWheelEntries: Int {
        state.withLock { $0.loops }.reduce(0) { total, loop in
            var entries = 0
            loop.owned { entries = loop.wheel.count }  // on the loop's thread while it runs
            return total + entries
        }
    }

    /// Waits until every loop has run `count` more timer ticks, so that a time change made
    /// on an injected clock has been seen by all of them. For tests and tools. Returns false
    /// on timeout.
    public func awaitTicks(_ count: Int = 2, timeout: Duration = .seconds(10)) -> Bool {
        let loops = state.withLock { $0.loops }
        let start = loops.map { $0.ticks.load(ordering: .acquiring) }
        return Self.poll(every: 1_000, for: timeout) {
            zip(loops, start).allSatisfy { $0.finished.load(ordering: .acquiring) || $0.ticks.load(ordering: .acquiring) >= $1 + count }
        }
    }

    /// Checks `condition` every `microseconds` until it holds (true) or `timeout` has passed
    /// (false): for waits on the loops' threads, which signal nothing else to wait on.
    private static func poll(every microseconds: UInt32, for timeout: Duration, until condition: () -> Bool) -> Bool {
        let deadline = SystemClock().now() + timeout
        while true {
            if condition() { return true }
            guard SystemClock().now() < deadline else { return false }
            usleep(microseconds)
        }
    }
}
