import SignalingCrypto
import SignalingProtocol
import SignalingPush
import SignalingStore
import SignalingSupport

/// Everything that tunes a server. Defaults are the embedded production defaults; every
/// field has a command-line option and a configuration-file key of the same name
/// (`ServerOptions`, docs/CONFIGURATION.md).
public struct ServerConfiguration: Sendable {
    /// Address to listen on. Loopback unless authentication is configured or
    /// `allowAnonymous` is set (`validate` enforces it; `ServerOptions` picks 0.0.0.0 when
    /// authentication is configured and no address is given).
    public var host = "127.0.0.1"
    /// Port to listen on; 0 picks a free port (tests).
    public var port: UInt16 = 7443
    /// The plain listener (`host`:`port`) is open. Off (`--listen off`, or `--tls-listen`
    /// without `--listen`) for a TLS-only server.
    public var plainListener = true
    /// The TLS listener, beside the plain one or instead of it (nil: none).
    public var tls: TLSListenerConfiguration?
    /// Length of each loop's queue of connections the kernel has completed but the loop has
    /// not accepted yet (`listen(2)`'s backlog). A reconnect storm overflows a short queue
    /// into SYN retries (1 s, then 3 s later). The kernel caps it at
    /// `net.core.somaxconn`, so the default is that maximum.
    public var listenBacklog = ServerConfiguration.systemMaxListenBacklog()
    /// Event-loop threads; each owns its connections and its users' routing shard.
    /// Default: one per core but one (`defaultWorkers`).
    public var workers = ServerConfiguration.defaultWorkers
    /// Keep-alive interval handed to clients, and the largest one granted on request.
    public var keepAlive: KeepAlivePolicy = try! KeepAlivePolicy(defaultInterval: 600, maximumInterval: 3600)
    /// How long an unanswered call rings.
    public var ringTimeout: Duration = .seconds(60)
    /// How long a call survives a party's connection loss (a resume within it keeps the call).
    public var callGrace: Duration = .seconds(10)
    /// Largest frame accepted (type byte plus body).
    public var maxFrameLength = ProtocolLimits.defaultMaxFrameLength
    /// Connections that send no HELLO within this are closed.
    public var handshakeTimeout: Duration = .seconds(10)
    /// Unacknowledged events kept per device.
    public var maxPendingEvents = 10_000
    /// Unacknowledged messages one sender may have waiting for one device of a recipient
    /// (or for a recipient with no device yet), so that one sender cannot fill a victim's
    /// queue for everyone else. Nil: half of `maxPendingEvents`.
    public var maxPendingPerSender: Int?
    /// Messages and calls one user may send per second, in bursts of up to twice as many;
    /// 0: no limit.
    public var senderRate = 0
    /// Bytes of undelivered events (bodies and their bookkeeping) the server may hold in
    /// memory; past it new messages and calls are refused with capacityExceeded.
    public var memoryBudget = ServerConfiguration.defaultMemoryBudget
    /// How long a disconnected device's session stays resumable.
    public var sessionTTL: Duration = .seconds(86_400)
    /// How long a device may stay away before it, and the events nobody collected for it,
    /// are forgotten (also: how long messages for a user with no device are held).
    public var eventTTL: Duration = .seconds(30 * 86_400)
    /// How long message ids are remembered for de-duplication, and how many at most.
    public var dedupWindow: Duration = .seconds(86_400)
    public var dedupCapacity = 1_000_000
    /// Bytes of replies that may wait for a client that does not read before the server
    /// stops reading its requests (events wait in the device's queue instead: at most
    /// `min(64 KiB, this)` plus one frame of them is ever encoded ahead of the socket).
    public var maxQueuedBytes = 1 << 20
    /// A client that reads nothing for this long while bytes wait for it is closed with
    /// CLOSE slowConsumer (its events stay pending for the resume).
    public var slowConsumerTimeout: Duration = .seconds(30)
    /// Connections allowed from one IP address (carrier NAT puts many phones behind one).
    public var maxConnectionsPerAddress = 10_000
    /// Every connection on the device listener starts with a PROXY protocol version 2
    /// header from the load balancer in front (HAProxy `send-proxy-v2`, a cloud balancer),
    /// naming the device's address: the per-address cap and the logs use that address.
    public var proxyProtocol = false
    /// Handshakes admitted per second (with a burst of the same size); 0 = unlimited.
    public var handshakeRate = 20_000
    /// CLOSE goingAway advice on shutdown: reconnect after this plus up to `drainJitter`.
    public var drainRetryAfter: Duration = .seconds(1)
    public var drainJitter: Duration = .seconds(30)
    /// How long shutdown waits for clients to read their CLOSE before closing anyway.
    public var drainTimeout: Duration = .seconds(5)
    /// The keys device tokens are signed with (docs/AUTH.md), from `--auth-key-file`:
    /// several at once during a rotation. Empty: version 1 tokens are not accepted.
    public var authKeys: [TokenKey] = []
    /// The legacy secret: when set, HELLO credentials `LegacyToken.make(secret:userID:)`
    /// are accepted too (tokens that never expire; docs/AUTH.md, "Legacy secret").
    public var authSecret: String?
    /// Accept devices on a non-loopback address without any authentication (like
    /// Mosquitto's `allow_anonymous true`). Without it, such a configuration is refused.
    public var allowAnonymous = false

    /// True when HELLO credentials are checked (device tokens, the legacy secret, or both).
    public var requiresAuthentication: Bool { !authKeys.isEmpty || authSecret != nil }

    /// True for 127.0.0.0/8, ::1 and `localhost`: addresses other hosts cannot reach.
    public static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }
    /// How often each loop runs its timers (idle timeouts, ring timeouts...). Deadlines
    /// are kept to the second; this only bounds how late they are noticed.
    public var tickInterval: Duration = .milliseconds(250)
    /// TCP_USER_TIMEOUT on client sockets: unacknowledged data older than this kills the
    /// connection (its events stay pending for the resume).
    public var tcpUserTimeout: Duration = .seconds(30)
    /// After any activity, each loop keeps polling without sleeping for this long, which
    /// saves the wake-up of a sleeping thread on the next event (lower push latency, at the
    /// cost of CPU while traffic flows). Zero: always sleep in epoll_wait.
    public var busyPoll: Duration = .zero
    /// The scheduler slice each loop thread asks for (`JoinableThread.setSlice`; zero: the
    /// kernel's default). Shorter than the other threads' (the store writer's, a
    /// neighbour's), it lets a loop woken by a request preempt them at once (Linux 6.12
    /// and later; earlier kernels ignore it).
    public var loopSlice: Duration = .zero
    /// Whether the loop threads run under `SCHED_FIFO` while they keep up
    /// (`LoopRealtimeSupervision`: at the normal policy through a ramp of connections,
    /// while a loop is saturated and while the hypervisor steals). A loop at a real-time
    /// priority is never preempted by a thread of the normal policy (the load generator on
    /// the same host, the store writer, a neighbour) while it handles a request, and takes
    /// its CPU from them at once when woken: on a 2-core VM that halved the closed-loop push p99
    /// (docs/LOAD-TESTING.md). `auto` (the default) does so at priority 1 where the process
    /// may (CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1) and never with `busyPoll`; a
    /// priority given outright is refused with `busyPoll`.
    public var loopRealtime = LoopRealtimeMode.auto
    /// Where the loops' supervision reads the host's stolen CPU time (tests give a file
    /// of their own).
    var hostCPUTimePath = HostCPUTime.path
    /// While the server runs, ask the kernel to keep every CPU able to wake within this
    /// (a PM QoS request on /dev/cpu_dma_latency; 0: idle CPUs poll instead of halting).
    /// Saves the wake-up of a halted CPU on each hop of a push, which dominates push
    /// latency on virtual machines; costs power and host CPU while idle. Nil: leave the
    /// host's idle policy alone. Needs root; without it the server warns and runs anyway.
    public var cpuLatencyLimit: Duration?
    /// CPUs for the event loops: loop i runs only on `loopCPUs[i % count]`. Empty: the
    /// scheduler places them. For a polling loop (`busyPoll`) on a core of its own.
    public var loopCPUs: [Int] = []
    /// With `auto` and a store, and more CPUs allowed than loops: loop *i* runs on the
    /// *i*-th CPU the process may use, the store writer and the store's own threads on the
    /// others, so that the store's work never takes a loop's CPU (`ThreadPlacement`).
    /// `loopCPUs` wins over it. A refused placement is a warning, never a failed start.
    public var threadPlacement = ThreadPlacementMode.off
    /// With `auto` and a store: the store writer and the store's own threads run at the
    /// idle scheduling policy while they keep up, at the normal one while they fall behind
    /// (`StoreThreadPriority`), when the process may raise them back; `normal` leaves them
    /// at the normal policy.
    public var storeThreadPriority = StoreThreadPriorityMode.auto
    /// Where push wake-ups go for devices with no connection (nil: none are sent).
    public var pushGateway: PushGatewayConfiguration?
    /// Push key files a reload could not read (`ServerOptions.configuration(from:running:)`);
    /// `pushGateway` holds the running signing material for them. Empty at start, where
    /// such a file is an error.
    public var refusedPushCredentials: [RefusedCredential] = []
    /// As the routing node of a cluster (`SignalingServer.enableRelay`): how often it asks
    /// the node link whether the fronts it has relayed connections from are still alive
    /// (a front killed with -9 is gone after its presence TTL). Nil: the lease TTL
    /// (`storage.redisLeaseTTL`). Kept on the server clock (loop 0's tick).
    public var relayPresenceInterval: Duration?
    /// How often a `stats` line is logged (zero: never).
    public var statsInterval: Duration = .seconds(60)
    /// Minimum log level.
    public var logLevel: LogLevel = .info
    /// How log lines are written: `key=value` pairs or one JSON object per line.
    public var logFormat: LogFormat = .keyValue
    /// The admin HTTP API (metrics, health, backend calls); nil: off.
    public var admin: AdminConfiguration?
    /// Where events are kept until devices acknowledge them.
    public var storage: StorageConfiguration = StorageConfiguration()
    /// With the SQLite store: whether connected devices get events at once or only after
    /// their commit (the sender's OK waits for the commit either way).
    public var delivery = Delivery.immediate
    /// How long the store writer gathers operations before it commits them (group commit
    /// window). With `.immediate` delivery it delays only the senders' OKs, not the push.
    public var commitInterval: Duration = .milliseconds(2)
    /// How long an accepted message may wait for its commit before the sender gets
    /// ERROR storeUnavailable instead (the store is full or unwritable).
    public var storeTimeout: Duration = .seconds(5)

    public init() {}

    /// A quarter of the machine's memory: room for the connections, the store's cache and
    /// the rest of the process beside the events.
    public static var defaultMemoryBudget: Int {
        #if canImport(Glibc)
        let pages = sysconf(Int32(_SC_PHYS_PAGES)), pageSize = sysconf(Int32(_SC_PAGESIZE))
        if pages > 0 && pageSize > 0 { return pages * pageSize / 4 }
        #endif
        return 1 << 30
    }

    /// The kernel's cap on a listen backlog, read from `path` (`net.core.somaxconn`);
    /// 4096 (the kernel's default since 5.4) where it cannot be read.
    public static func systemMaxListenBacklog(path: String = "/proc/sys/net/core/somaxconn") -> Int {
        guard let text = readTextFile(path), let value = Int(text.split(separator: "\n").first ?? ""), value > 0 else {
            return 4096
        }
        return min(value, Int(Int32.max))
    }

    /// One loop per core but one, at least one: the core left over runs the store writer
    /// (and its checkpointer), the push gateway and the kernel's network work, which
    /// otherwise preempt a loop in the middle of a push. On a 2-core host that is one loop,
    /// so no push crosses loops (a step to another shard's loop wakes that loop's thread):
    /// measured on this project's 2-core VM at 15,000 devices, one loop gave push p50 23 µs
    /// (memory store) and 46 µs (SQLite) closed-loop against 55-74 and 63-67 µs with two
    /// (docs/LOAD-TESTING.md, "Loops on a 2-core host").
    public static var defaultWorkers: Int { max(1, coreCount - 1) }

    public static var coreCount: Int {
        #if canImport(Glibc)
        return max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        #else
        return 2
        #endif
    }

    var switchboard: SwitchboardConfiguration {
        SwitchboardConfiguration(
            maxPendingEvents: maxPendingEvents, sessionTTL: sessionTTL, eventTTL: eventTTL, ringTimeout: ringTimeout,
            callGrace: callGrace, dedupWindow: dedupWindow, dedupCapacity: dedupCapacity, delivery: delivery,
            maxPendingPerSender: maxPendingPerSender ?? max(1, maxPendingEvents / 2), senderRate: senderRate,
            memoryBudget: memoryBudget)
    }

    /// Checks relations between fields that no single option can check.
    public func validate() throws(UsageError) {
        guard (1...256).contains(workers) else { throw UsageError("workers must be between 1 and 256") }
        guard maxFrameLength >= 256 else { throw UsageError("max-frame must be at least 256 bytes") }
        guard maxQueuedBytes >= maxFrameLength else { throw UsageError("max-queued-bytes must be at least max-frame") }
        guard sessionTTL >= callGrace else { throw UsageError("session-ttl must be at least call-grace") }
        guard eventTTL >= sessionTTL else { throw UsageError("event-ttl must be at least session-ttl") }
        guard maxPendingEvents >= 1 else { throw UsageError("max-pending must be at least 1") }
        guard tickInterval > .zero && tickInterval <= .seconds(1) else {
            throw UsageError("tick must be between 1 ms and 1 s")
        }
        if case .priority = loopRealtime, busyPoll > .zero {
            throw UsageError("--loop-realtime and --busy-poll together would keep a loop's CPU from every other thread: choose one")
        }
        if let limit = cpuLatencyLimit, limit < .zero || limit > .seconds(1) {
            throw UsageError("cpu-latency-limit must be between 0 and 1,000,000 microseconds")
        }
        guard plainListener || tls != nil else {
            throw UsageError("--listen off leaves no listener: give --tls-listen too, or a --listen address")
        }
        if proxyProtocol && !plainListener {
            throw UsageError("--proxy-protocol is for the plain listener, which is off: for the TLS listener give --tls-proxy-protocol")
        }
        let listeners = (plainListener ? [("--listen", host)] : []) + (tls.map { [("--tls-listen", $0.host)] } ?? [])
        for (option, address) in listeners where !requiresAuthentication && !allowAnonymous && !Self.isLoopback(address) {
            throw UsageError(
                "\(option) \(address) without authentication would let anyone on the network claim any user id: "
                    + "give --auth-key-file (or --auth-secret-file), or --allow-anonymous to accept that")
        }
        try admin?.validate()
    }
}

/// The durable store's settings.
public struct StorageConfiguration: Sendable, Equatable {
    public enum Mode: String, Sendable {
        /// SQLite in `directory`: events survive restarts and crashes.
        case sqlite
        /// Memory only: fastest, but a restart loses every pending event.
        case memory
        /// Redis at `redisURL` (docs/STORAGE.md, "Redis").
        case redis
    }

    public var mode: Mode = .sqlite
    /// `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` with `.redis`, or several separated by
    /// commas (the store's instances, users spread over them; the first holds the lease).
    /// The executable's store parses it when it opens the store.
    public var redisURL: String?
    /// The weakest AOF setting the Redis store accepts.
    public enum RedisFsync: String, Sendable {
        /// `appendfsync always`: an accepted message survives a crash of Redis's machine.
        case always
        /// `appendfsync everysec` or better: it survives a crash of the Redis process; a
        /// crash of its machine can lose about the last second.
        case everysec
    }

    public var redisFsync: RedisFsync = .always
    /// Run with a Redis whose AOF is off or weaker than `redisFsync` (warning instead of refusing to start).
    public var redisAllowVolatile = false
    /// How long the store lease lasts without a refresh (docs/CLUSTER.md): a node that
    /// cannot refresh it steps down before it expires, and a standby takes over once it
    /// has. Failover takes about this long after a crash; a shorter one lets a Redis
    /// hiccup (a slow fsync, a restart) step the active node down.
    public var redisLeaseTTL: Duration = .seconds(10)
    /// A cluster member (`--cluster`, docs/CLUSTER.md "Fronts"): with `.redis`, the node
    /// serves devices in every role, as the home while it holds the lease and as a front
    /// relaying to the home otherwise (a standby does not listen).
    public var cluster = false
    /// The Redis that carries the cluster's node link (relay packets, presence keys), when
    /// not the store's (`--cluster-link`): pub/sub needs no persistence, and on a Redis of
    /// its own it does not wait behind the store's AOF fsyncs. Nil: the store's Redis.
    public var clusterLinkURL: String? = nil
    /// The data directory (created if missing). Default: `$STATE_DIRECTORY` (set by
    /// systemd's StateDirectory=) or `./voipserver-data`.
    public var directory: String = StorageConfiguration.defaultDirectory
    /// When a commit is on disk (see docs/STORAGE.md).
    public enum Synchronous: String, Sendable {
        /// Survives a crash of the process.
        case normal
        /// Also survives a power loss (slower commits).
        case full
    }

    public var synchronous: Synchronous = .normal
    /// Largest size of the database file, in bytes (nil: as large as the disk allows).
    public var maxBytes: Int?

    public init() {}

    public static var defaultDirectory: String {
        if let state = getenv("STATE_DIRECTORY"), let text = String(validatingCString: state), !text.isEmpty {
            return text.split(separator: ":").first.map(String.init) ?? text
        }
        return "voipserver-data"
    }
}

#if canImport(Glibc)
import Glibc
#endif

/// A credential file a reload refused: its option and why (logged as `reload_refused`).
public struct RefusedCredential: Sendable, Equatable {
    public var option: String
    public var detail: String

    public init(option: String, detail: String) {
        self.option = option
        self.detail = detail
    }
}
