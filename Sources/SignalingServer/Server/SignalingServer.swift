import CLinuxShims
import SignalingProtocol
import SignalingPush
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The signaling server: `workers` event loops on their own threads, each accepting on
/// its own SO_REUSEPORT socket, sharing one routing core.
///
///     let server = try SignalingServer(configuration: configuration)
///     try server.start()          // returns once listening
///     ...
///     server.shutdown()           // CLOSE goingAway to everyone, then stop
public final class SignalingServer: Sendable {
    public let configuration: ServerConfiguration
    private let context: ServerContext
    private let writer: StoreWriter?
    private let pushGateway: PushGateway?
    private let state = Mutex<RunState>(RunState())

    private struct RunState: ~Copyable {
        var loops: [EventLoop] = []
        var threads: [JoinableThread] = []
        var port: UInt16 = 0
        /// Held from start until the loops have stopped (see `cpuLatencyLimit`).
        var cpuLatencyRequest: CPULatencyRequest?
        var started = false
        var stopped = false
    }

    /// - Parameter store: where events are kept until acknowledged. Nil keeps them in
    ///   memory only (a restart loses them).
    public init(
        configuration: ServerConfiguration, clock: any Clock = SystemClock(), logger: Logger = Logger(),
        store: (any EventStore)? = nil
    ) throws(ServerError) {
        do {
            try configuration.validate()
        } catch {
            throw ServerError(error.message)
        }
        self.configuration = configuration
        var pushGateway: PushGateway?
        if let push = configuration.pushGateway {
            do {
                pushGateway = try PushGateway(configuration: push, clock: clock, logger: logger)
            } catch {
                throw ServerError("push gateway: \(error.message)")
            }
        }
        self.pushGateway = pushGateway
        let context = ServerContext(
            configuration: configuration, clock: clock, logger: logger, journaling: store != nil, pushGateway: pushGateway)
        self.context = context
        context.switchboard.withState(wall: clock.wallMilliseconds()) { $0.pushAvailable = pushGateway != nil }
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
        let now = clock.now()
        context.switchboard.withState(wall: clock.wallMilliseconds()) { board in
            board.load(snapshot, now: now)
        }
        logger.info("store_loaded", [
            "devices": snapshot.devices.count, "pending_events": snapshot.devices.reduce(0) { $0 + $1.events.count },
            "held_events": snapshot.held.values.reduce(0) { $0 + $1.count },
        ])
        let writer = try StoreWriter(store: store, context: context)
        context.switchboard.attach(writer)
        self.writer = writer
    }

    /// Binds the listening sockets and starts the loops. Returns once the server accepts.
    public func start() throws(ServerError) {
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
        var loops: [EventLoop] = []
        var port = configuration.port
        var errorText = [CChar](repeating: 0, count: 256)
        func lastError() -> String {
            String(decoding: errorText.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        if port != 0 && shim_port_is_free(configuration.host, port, &errorText, errorText.count) == 0 {
            throw ServerError(lastError() + " (is another voipserver running?)")
        }
        for index in 0..<configuration.workers {
            // The first socket may pick the port (port 0); the others join it.
            let fd = shim_listen_tcp(configuration.host, port, 1, 4096, &errorText, errorText.count)
            guard fd >= 0 else {
                for loop in loops { loop.stopListening() }
                throw ServerError(lastError())
            }
            if index == 0 { port = UInt16(shim_local_port(fd)) }
            do {
                loops.append(try EventLoop(index: UInt16(index), context: context, listenFD: fd))
            } catch {
                close(fd)
                for loop in loops { loop.stopListening() }
                throw error
            }
        }
        for loop in loops { loop.peers = loops }
        if let writer {
            writer.loops = loops
            writer.start()
        }

        let cpuLatencyRequest = requestCPULatencyLimit()
        let threads = loops.map { loop in JoinableThread(name: "vs-loop-\(loop.index)") { loop.run() } }
        state.withLock {
            $0.cpuLatencyRequest = cpuLatencyRequest
            $0.loops = loops
            $0.threads = threads
            $0.port = port
            $0.started = true
        }
        // Loop i on the i-th CPU of the list (wrapping): a polling loop keeps its core
        // and its caches, and the scheduler never moves it next to whoever woke it.
        let placement = loopCPUs.isEmpty ? [] : threads.indices.map { loopCPUs[$0 % loopCPUs.count] }
        for (index, cpu) in placement.enumerated() {
            let error = threads[index].pin(toCPU: cpu)
            guard error == 0 else {
                shutdown()
                throw ServerError("--loop-cpus: cannot run loop \(index) on CPU \(cpu): \(SystemError("pthread_setaffinity_np", error).reason)")
            }
        }
        if configuration.authSecret == nil {
            context.logger.warning("auth_disabled", ["detail": "no --auth-secret: any device may claim any user id"])
        }
        context.logger.info("listening", [
            "addr": "\(configuration.host):\(port)", "workers": configuration.workers,
            "keepalive": configuration.keepAlive.defaultInterval,
            "auth": configuration.authSecret == nil ? "off" : "hmac",
            "cpu_latency_limit": cpuLatencyRequest.map { "\($0.microseconds)us" } ?? "none",
            "loop_cpus": placement.isEmpty ? "any" : placement.map(String.init).joined(separator: ","),
        ])
    }

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

    /// The port the server listens on (useful with port 0).
    public var port: UInt16 { state.withLock { $0.port } }

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
        context.counters.snapshot(context.switchboard.counters)
    }

    /// The push gateway's counters (nil without a gateway).
    public var pushStatistics: PushStatistics? { pushGateway?.statistics }

    /// The connections each loop holds open, loop 0 first: how the kernel spread them
    /// (`SO_REUSEPORT`). For tests and tools.
    public var openConnectionsPerLoop: [Int] {
        state.withLock { $0.loops }.map { $0.openConnections.load(ordering: .relaxed) }
    }

    /// Entries in the loops' idle-timeout wheels, stale ones included (for tests: the
    /// wheel keeps at most one per connection slot).
    var idleWheelEntries: Int {
        state.withLock { $0.loops }.reduce(0) { total, loop in total + loop.ownership.withLock { _ in loop.wheel.count } }
    }

    /// Waits until every loop has run `count` more timer ticks, so that a time change made
    /// on an injected clock has been seen by all of them. For tests and tools. Returns false
    /// on timeout.
    public func awaitTicks(_ count: Int = 2, timeout: Duration = .seconds(10)) -> Bool {
        let loops = state.withLock { $0.loops }
        let start = loops.map { $0.ticks.load(ordering: .acquiring) }
        let deadline = SystemClock().now() + timeout
        while SystemClock().now() < deadline {
            if zip(loops, start).allSatisfy({ $0.finished.load(ordering: .acquiring) || $0.ticks.load(ordering: .acquiring) >= $1 + count }) { return true }
            usleep(1_000)
        }
        return false
    }
}
