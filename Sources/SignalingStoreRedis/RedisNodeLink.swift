import CLinuxShims
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The nodes' channel over Redis pub/sub (`NodeLink`; docs/CLUSTER.md, "The node link"):
/// hiredis's asynchronous client on a libevent loop of the link's own thread, so the
/// server's loops never wait for Redis (`send` queues and returns; events reach the
/// handler on the link's thread).
///
/// Names in Redis (pub/sub ignores SELECT, so channels carry the database; keys do not):
///
/// | name | what |
/// |------|------|
/// | channel `voip:DB:node:NAME` | packets for the node that listens as NAME (its id, or a name from `listen(as:)`) |
/// | channel `voip:DB:probe:ID` | the link's own probe: it publishes there and must hear itself within the reply timeout |
/// | key `voip:node:ID` | the node's presence, `SET ... PX presenceTTL` at `up` and every third of the TTL |
///
/// Two connections: one subscribed (own channel, probe channel, `listen(as:)` names), one
/// for PUBLISH and the presence commands. Any connection error, a reply (or connect)
/// that takes longer than `replyTimeout`, or a probe not heard back in time drops both;
/// the handler gets `.down` once, and the link reconnects with back-off (100 ms doubling
/// to 5 s, with jitter; back to 100 ms after each `up`) and says `.up` once its own
/// channel's SUBSCRIBE is confirmed. Packets sent while it is not up are dropped (counted
/// in `Statistics.packetsDropped`): the contract is at most once, and `.down` told the
/// node to start over.
public final class RedisNodeLink: NodeLink, Sendable {
    public let nodeID: String
    public let endpoint: RedisEndpoint
    /// How long the presence key lives without a refresh (a node killed with -9 is `gone`
    /// after it).
    public let presenceTTL: Duration
    /// Bounds every connect and every reply, and a probe's round trip.
    public let replyTimeout: Duration

    private let logger: Logger
    private let inbox: NodeLinkInbox
    let counters = NodeLinkCounters()
    /// The link's thread, from `start` until `stop` joins it.
    private let thread = Mutex<JoinableThread?>(nil)
    private let started = Atomic<Bool>(false)

    /// What the link has done since it was made (for benchmarks and `/metrics`).
    public struct Statistics: Sendable, Equatable {
        /// Every command written to Redis: PUBLISH, presence, probes, SUBSCRIBE, AUTH, SELECT.
        public var commandsSent = 0
        /// Packets published to other nodes' channels (probes not counted), and their bytes.
        public var packetsOut = 0
        public var bytesPublished = 0
        /// Packets delivered to the handler, and their bytes.
        public var packetsIn = 0
        public var bytesReceived = 0
        /// Packets sent while the link was not up: never written.
        public var packetsDropped = 0
        /// PUBLISH replies that said nobody listens (each reported or coalesced).
        public var undeliverable = 0
        /// `.down` events.
        public var outages = 0
        /// Connects tried (the first included): with the back-off, a handful per outage.
        public var connectAttempts = 0
    }

    /// - Parameters:
    ///   - nodeID: this node's id and channel name; defaults to a new `HOST/PID/RANDOM`.
    ///   - presenceTTL: the presence key's TTL (at least 40 ms); refreshed every third of it.
    ///   - replyTimeout: defaults to a quarter of the presence TTL, at most 2 s (at least 10 ms).
    /// Throws `.io` when the wake-up descriptor cannot be made (out of descriptors).
    public init(
        endpoint: RedisEndpoint, nodeID: String? = nil, presenceTTL: Duration, replyTimeout: Duration? = nil, logger: Logger
    ) throws(StoreError) {
        self.endpoint = endpoint
        self.nodeID = nodeID ?? RedisLease.newOwnerID()
        self.presenceTTL = max(presenceTTL, .milliseconds(40))
        self.replyTimeout = max(.milliseconds(10), replyTimeout ?? min(.seconds(2), self.presenceTTL / 4))
        self.logger = logger
        inbox = try NodeLinkInbox()
    }

    deinit {
        stop()
    }

    public func start(_ handler: @escaping @Sendable (NodeLinkEvent) -> Void) {
        guard started.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        let loop = NodeLinkLoop(
            settings: NodeLinkLoop.Settings(
                nodeID: nodeID, endpoint: endpoint, presenceTTL: presenceTTL, replyTimeout: replyTimeout),
            inbox: inbox, counters: counters, handler: handler, logger: logger)
        thread.withLock { $0 = JoinableThread(name: "redis-link") { loop.run() } }
    }

    public func listen(as name: String) { inbox.post(.listen(name)) }

    /// `nodeID` itself cannot be given up: the link listens as it for its whole life.
    public func stopListening(as name: String) { inbox.post(.stopListening(name)) }

    public func send(_ packet: [UInt8], to node: String) { inbox.post(.packet(packet, to: node)) }

    public func checkListener(_ name: String) { inbox.post(.checkListener(name)) }

    public func checkPresence(of nodes: [String]) {
        guard !nodes.isEmpty else { return }
        inbox.post(.checkPresence(nodes))
    }

    /// Deletes the presence key (best effort, within `replyTimeout`) so that the other
    /// nodes see this one gone at once, drops the connections and joins the thread.
    public func stop() { stop(deletingPresence: true) }

    /// Stops as a node killed with -9 would look from outside: the presence key is left to
    /// expire (tests).
    func abandon() { stop(deletingPresence: false) }

    private func stop(deletingPresence: Bool) {
        guard let thread = thread.withLock({ thread -> JoinableThread? in
            defer { thread = nil }
            return thread
        }) else { return }
        inbox.requestStop(deletingPresence: deletingPresence)
        thread.join()
    }

    public func statistics() -> Statistics { counters.snapshot() }

    /// The channel of the node that listens as `name`, in `database` (the table above).
    public static func channel(of name: String, database: Int) -> String { "voip:\(database):node:\(name)" }
    /// The channel a link publishes its probes to and hears them on.
    static func probeChannel(of node: String, database: Int) -> String { "voip:\(database):probe:\(node)" }
    /// The presence key of `node` (in the endpoint's database).
    public static func presenceKey(of node: String) -> String { "voip:node:\(node)" }
}

/// What other threads hand the link's thread, in the order they called: packets, listen
/// changes and presence checks share one FIFO, so a thread's packets to one node are
/// published in the order it sent them, and a packet one thread queued before another
/// thread queued its own (a front's `.reset` under its route lock, then a loop's `.open`)
/// stays ahead of it. A lock-free `MPSCQueue` (like the loops' inboxes: no poster ever
/// waits for another, or for the link's thread) plus an eventfd written only by the push
/// that found the queue empty (one wake-up per batch the link takes). O(1) per request
/// (one node allocation and one atomic exchange).
final class NodeLinkInbox: Sendable {
    enum Request {
        case packet([UInt8], to: String)
        case listen(String)
        case stopListening(String)
        case checkPresence([String])
        case checkListener(String)
    }

    struct Taken {
        var requests: [Request]
        /// nil: keep running; true/false: stop, deleting the presence key or not.
        var stop: Bool?
    }

    private let requests = MPSCQueue<Request>()
    /// 0: running; 1: stop, leaving the presence key; 2: stop, deleting it.
    private let stop = Atomic<Int>(0)
    /// Readable when requests wait or a stop was asked.
    let wakeFD: Int32

    init() throws(StoreError) {
        let fd = shim_eventfd()
        guard fd >= 0 else { throw StoreError(.io, "cannot create an eventfd for the node link: \(String(cString: strerror(errno)))") }
        wakeFD = fd
    }

    deinit { close(wakeFD) }

    func post(_ request: Request) {
        if requests.push(request) == .queuedFirst { shim_eventfd_signal(wakeFD) }
    }

    func requestStop(deletingPresence: Bool) {
        stop.store(deletingPresence ? 2 : 1, ordering: .releasing)
        shim_eventfd_signal(wakeFD)
    }

    /// On the link's thread, when `wakeFD` is readable. The eventfd is drained first: a
    /// push that lands after the take found the queue empty and writes it again.
    func take() -> Taken {
        shim_eventfd_drain(wakeFD)
        var taken = Taken(requests: [], stop: nil)
        requests.takeAll(appendingTo: &taken.requests)
        switch stop.load(ordering: .acquiring) {
        case 1: taken.stop = false
        case 2: taken.stop = true
        default: break
        }
        return taken
    }
}

/// `RedisNodeLink.Statistics` as atomics: written by the link's thread, read by anyone.
final class NodeLinkCounters: Sendable {
    let commandsSent = Atomic<Int>(0)
    let packetsOut = Atomic<Int>(0)
    let bytesPublished = Atomic<Int>(0)
    let packetsIn = Atomic<Int>(0)
    let bytesReceived = Atomic<Int>(0)
    let packetsDropped = Atomic<Int>(0)
    let undeliverable = Atomic<Int>(0)
    let outages = Atomic<Int>(0)
    let connectAttempts = Atomic<Int>(0)

    func snapshot() -> RedisNodeLink.Statistics {
        RedisNodeLink.Statistics(
            commandsSent: commandsSent.load(ordering: .relaxed), packetsOut: packetsOut.load(ordering: .relaxed),
            bytesPublished: bytesPublished.load(ordering: .relaxed), packetsIn: packetsIn.load(ordering: .relaxed),
            bytesReceived: bytesReceived.load(ordering: .relaxed), packetsDropped: packetsDropped.load(ordering: .relaxed),
            undeliverable: undeliverable.load(ordering: .relaxed), outages: outages.load(ordering: .relaxed),
            connectAttempts: connectAttempts.load(ordering: .relaxed))
    }
}
