import CLibeventShims
import CLinuxShims
import SignalingProtocol
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Work handed to a loop by other threads.
enum LoopTask: Sendable {
    /// Events are pending for this connection's device: write them.
    case wake(ConnectionRef)
    /// Close this connection with this frame (another connection took over its device).
    /// A takeover by a device's new connection never comes here: both connections live on
    /// their user's home loop, which closes the old one itself (`apply`). This carries the
    /// takeovers of servers whose loops own no shard, and the admin API's closes (a
    /// revoked session, a forgotten user).
    case close(ConnectionRef, Close)
    /// Send this reply (an OK deferred until the store committed a message, or its ERROR).
    case reply(ConnectionRef, Frame)
    /// Another loop wrote part of this connection's events; the rest waits in `outbound`:
    /// watch the socket for writability (only the owning loop may touch its event base).
    case watchWritable(ConnectionRef)
    /// The bodies this connection's pump asked the store for are back in memory.
    case bodiesLoaded(ConnectionRef)
    /// Server shutdown: stop accepting, tell every client to go away, exit when done.
    case drain
    /// A commit returned: release what it made durable, then send its OKs.
    case released(CommittedRelease)
    /// A connection whose HELLO another loop verified comes to live here, its user's home
    /// loop: register its device and handle what it sent after the HELLO
    /// (EventLoop+HandOver.swift). Posted only by `post(adopting:)`.
    case adopt(MovingConnection)

    /// The loop that runs it.
    var loop: UInt16 {
        switch self {
        case .wake(let ref), .close(let ref, _), .reply(let ref, _), .watchWritable(let ref), .bodiesLoaded(let ref):
            return ref.loop
        case .drain: return 0
        case .released(let release): return release.loop
        case .adopt(let moving): return moving.home
        }
    }
}

/// One libevent `event_base` running on its own thread, memcached-style: it accepts on its
/// own SO_REUSEPORT listening sockets (plain, TLS, or both), and owns every connection it
/// accepted until that connection closes or, once its HELLO is verified, moves to its
/// user's home loop (EventLoop+HandOver.swift), which owns it from then on.
///
/// Concurrency: the loop's state (connection table, buffers, deadlines) is touched only
/// while `ownership` is held. The loop's own thread holds it for each libevent callback
/// and releases it while it waits in epoll. While it waits, another loop may take it, only
/// with a try-lock, to write pending events to a connection of this loop directly
/// (`writeFromPeer`), which spares a hand-off and a wake-up of this thread.
/// libevent's event base is only ever called from the loop's own thread. Any thread may
/// call `post(_:)`: tasks go into a locked inbox and an eventfd wakes the loop. The class
/// is `@unchecked Sendable` so that it can be handed to its thread and to other loops.
final class EventLoop: @unchecked Sendable {
    let index: UInt16
    let context: ServerContext
    /// All loops of the server (including this one), for cross-loop delivery.
    /// Set once before the threads start.
    var peers: [EventLoop] = []

    let base: OpaquePointer
    var table: ConnectionTable
    var wheel: TimingWheel
    /// Handshake deadlines (constant length, so FIFO order is deadline order), exact: a
    /// deadline kept in whole seconds from a stamp rounded down fired up to 1 s early.
    var helloDeadlines = FIFOQueue<(slot: UInt32, generation: UInt32, deadline: Instant)>()
    /// Device addresses from PROXY headers, by slot, from the header to the HELLO, for the
    /// handshake's log lines (EventLoop+Proxy.swift); empty without `--proxy-protocol`.
    var proxiedPeers: [UInt32: (generation: UInt32, address: PeerAddress)] = [:]
    /// Connections whose HELLO this loop verified for a user of another loop's shard:
    /// they leave for that loop when the current callback ends (`handOverDeparting`).
    var departing: [Departure] = []
    /// Linger deadlines of closing connections.
    var closingDeadlines = FIFOQueue<(slot: UInt32, generation: UInt32, deadline: UInt32)>()
    /// Connections whose device has new events to write once the current callback is done
    /// (coalesces many events for one connection into one write).
    var dirtySlots: [(slot: UInt32, generation: UInt32)] = []
    /// The other half of `dirtySlots`' double buffer: `flushDirty` walks one while new
    /// marks go to the other, so marking a connection allocates nothing.
    var flushingSlots: [(slot: UInt32, generation: UInt32)] = []
    /// Shared input buffer: every connection reads into it; only partial frames are copied.
    let readBuffer: UnsafeMutableRawBufferPointer
    /// Shared output scratch buffer.
    var scratch: [UInt8] = []
    /// Replies collected for `replySlot` while its input is handled (see `send`).
    var replies: [UInt8] = []
    var replySlot: UInt32?
    /// Replies taken from the inbox, written by `sendPostedReplies` (loop thread only).
    private var postedReplies: [(ref: ConnectionRef, frame: Frame)] = []
    let decoder: FrameDecoder
    /// Cached once per callback: the current time on the server's second timeline
    /// (rounded down: a deadline in these seconds must add one to be never early).
    var nowSeconds: UInt32 = 0
    /// Cached once per callback: the current time, exact.
    var nowInstant = Instant(nanoseconds: 0)

    /// The plain listener's socket (-1: none, or stopped).
    var listenFD: Int32
    private var listenEvent: OpaquePointer?
    /// The TLS listener's socket (-1: none, or stopped).
    var tlsListenFD: Int32
    private var tlsListenEvent: OpaquePointer?
    private var wakeEvent: OpaquePointer?
    private var tickEvent: OpaquePointer?
    /// Lives as long as the loop object, not as long as `run`: anyone holding the loop may
    /// `post` to it, even after it has drained (another loop still draining, the store
    /// writer's last release), and a descriptor closed under them would be reused by the
    /// next socket the process opens, which would then receive the wake-up's 8 bytes.
    let wakeFD: Int32
    private let inbox = Mutex(LoopInbox())
    /// Held while the loop's state is used (see the type's comment).
    let ownership = Mutex(LoopOwnership())
    /// Set when the loop has been told to drain; holds the time by which it must be done.
    var drainDeadline: UInt32?
    /// Ticks run so far (read by `SignalingServer.awaitTicks`).
    let ticks = Atomic<Int>(0)
    /// Connections this loop holds open (read by `SignalingServer.openConnectionsPerLoop`).
    let openConnections = Atomic<Int>(0)
    /// Set when `run` has returned.
    let finished = Atomic<Bool>(false)
    /// What `/metrics` reports about this loop (updated under `ownership`).
    let metrics = LoopMetrics()
    /// The transport of an embedded loop, whose connections are not sockets (tests); nil
    /// for a real loop, which calls the socket code directly (ConnectionIO.swift).
    let embeddedIO: (any ConnectionIO)?

    static let readBufferSize = 64 * 1024
    static let lingerSeconds: UInt32 = 2

    /// - Parameter embeddedIO: the transport of a loop without sockets (see `embeddedIO`):
    ///   it is never `run`; its owner calls the inputs (ConnectionIO.swift) itself.
    init(
        index: UInt16, context: ServerContext, listenFD: Int32, tlsListenFD: Int32 = -1,
        embeddedIO: (any ConnectionIO)? = nil
    ) throws(ServerError) {
        guard let base = vs_event_base_new() else { throw ServerError("cannot create an event base") }
        let wakeFD = shim_eventfd()
        guard wakeFD >= 0 else {
            vs_event_base_free(base)
            throw ServerError("cannot create an eventfd: \(String(cString: strerror(errno)))")
        }
        self.index = index
        self.context = context
        self.base = base
        self.listenFD = listenFD
        self.tlsListenFD = tlsListenFD
        self.table = ConnectionTable(holdsTLS: tlsListenFD >= 0)
        self.wakeFD = wakeFD
        self.embeddedIO = embeddedIO
        self.decoder = FrameDecoder(maxFrameLength: context.configuration.maxFrameLength, from: .client)
        self.readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.readBufferSize, alignment: 16)
        self.wheel = TimingWheel(startSecond: context.seconds(at: context.clock.now()))
        scratch.reserveCapacity(Self.readBufferSize)
    }

    deinit {
        // A loop that never ran (an embedded one, or a start that failed) still owns its
        // event base; `run` frees it when it ends. The eventfd goes only now (see `wakeFD`).
        if !finished.load(ordering: .acquiring) { vs_event_base_free(base) }
        close(wakeFD)
        readBuffer.deallocate()
    }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Runs one libevent callback of this loop with `ownership` held.
    @inline(__always)
    func owned(_ callback: () -> Void) {
        ownership.withLock { ownership in
            ownership.waiting = false
            callback()
            // After the callback's reads: a plain socket's peeked bytes are taken by now,
            // and nothing below the read touches the connection any more.
            if !departing.isEmpty { handOverDeparting() }
        }
        // Outside the lock: peers may write to our connections during the system call.
        if writerWakePending {
            writerWakePending = false
            context.switchboard.writer?.wake()
        }
    }

    /// Runs the loop on the calling thread until it has drained.
    func run() {
        shim_set_current_loop(unmanagedSelf)
        let persistRead = Int16(VS_EV_READ | VS_EV_PERSIST)
        if listenFD >= 0 {
            listenEvent = vs_event_new(base, listenFD, persistRead, { _, _, arg in
                let loop = Unmanaged<EventLoop>.fromOpaque(arg!).takeUnretainedValue()
                loop.owned { loop.acceptConnections(tls: false) }
            }, unmanagedSelf)
            vs_event_add(listenEvent, -1)
        }
        if tlsListenFD >= 0 {
            tlsListenEvent = vs_event_new(base, tlsListenFD, persistRead, { _, _, arg in
                let loop = Unmanaged<EventLoop>.fromOpaque(arg!).takeUnretainedValue()
                loop.owned { loop.acceptConnections(tls: true) }
            }, unmanagedSelf)
            vs_event_add(tlsListenEvent, -1)
        }
        wakeEvent = vs_event_new(base, wakeFD, persistRead, { _, _, arg in
            let loop = Unmanaged<EventLoop>.fromOpaque(arg!).takeUnretainedValue()
            loop.owned { loop.runInbox() }
        }, unmanagedSelf)
        tickEvent = vs_event_new(base, -1, Int16(VS_EV_PERSIST), { _, _, arg in
            let loop = Unmanaged<EventLoop>.fromOpaque(arg!).takeUnretainedValue()
            loop.owned { loop.tick() }
        }, unmanagedSelf)
        vs_event_add(wakeEvent, -1)
        vs_event_add(tickEvent, max(1, context.configuration.tickInterval.microseconds))

        runUntilBroken()

        ownership.withLock { ownership in
            // Connections handed over after the loop stopped: they still get their CLOSE.
            refreshTime()
            for moving in closeInbox() { adopt(moving, closingWith: drainClose) }
            ownership.running = false  // peers stop writing here
            for slot in table.liveSlots() { destroy(slot) }
            table.deallocate()
        }
        stopListening()
        for event in [wakeEvent, tickEvent] { if let event { vs_event_free(event) } }
        vs_event_base_free(base)  // the eventfd stays open until deinit (see `wakeFD`)
        shim_set_current_loop(nil)
        finished.store(true, ordering: .releasing)
    }

    /// When loop 0 next logs its statistics line (server seconds; 0 = not yet scheduled).
    var nextStatsSecond: UInt32 = 0
    /// Callbacks run so far; the busy-poll window restarts whenever it moves.
    var activity: UInt64 = 0
    /// A commit unit was queued during the current callback and the store writer must be
    /// woken once it ends (`Switchboard.WriterWake.afterCallback`). Loop-thread state.
    var writerWakePending = false

    /// Runs the event loop until `event_base_loopbreak`. With a busy-poll window, the loop
    /// keeps polling without sleeping for that long after its last activity, so that the
    /// next event does not pay for waking a sleeping thread (on virtual machines that wake-up
    /// dominates push latency); otherwise it sleeps in epoll_wait like any libevent loop.
    private func runUntilBroken() {
        let window = context.configuration.busyPoll
        let clock = SystemClock()
        var lastActivity = clock.now()
        var seen = activity
        while vs_event_base_got_break(base) == 0 {
            if window > .zero && clock.now() - lastActivity < window {
                if vs_event_base_loop(base, VS_EVLOOP_ONCE | VS_EVLOOP_NONBLOCK) < 0 { return }
            } else {
                // Until a callback runs, this thread is asleep in epoll: peers write to its
                // connections themselves rather than wake it (`writeFromPeer`).
                ownership.withLock { $0.waiting = true }
                if vs_event_base_loop(base, VS_EVLOOP_ONCE) < 0 { return }
            }
            if activity != seen {
                seen = activity
                lastActivity = clock.now()
            }
        }
    }

    /// Hands a task to this loop from any thread.
    func post(_ task: LoopTask) {
        post(contentsOf: CollectionOfOne(task))
    }

    func post(contentsOf tasks: some Collection<LoopTask>) {
        _ = enqueue(tasks, unlessStopped: false)
    }

    /// Appends `tasks` to the inbox, unless `unlessStopped` and the loop has stopped
    /// (then false: nothing was posted).
    private func enqueue(_ tasks: some Collection<LoopTask>, unlessStopped: Bool) -> Bool {
        guard !tasks.isEmpty else { return true }
        let wasEmpty = inbox.withLock { inbox -> Bool? in
            guard inbox.open || !unlessStopped else { return nil }
            let wasEmpty = inbox.tasks.isEmpty
            inbox.tasks.append(contentsOf: tasks)
            return wasEmpty
        }
        guard let wasEmpty else { return false }
        // One eventfd write per batch: a loop that has not drained its inbox yet will see
        // the new tasks anyway.
        if wasEmpty { shim_eventfd_signal(wakeFD) }
        return true
    }

    /// Tasks wait in the inbox: what an embedded loop's owner checks instead of an epoll
    /// wait on the eventfd (ConnectionIO.swift).
    var hasPostedTasks: Bool { inbox.withLock { !$0.tasks.isEmpty } }

    /// Hands a connection to this loop, its user's home loop (`LoopTask.adopt`). False when
    /// the loop has stopped and will run no more tasks: the caller keeps the connection.
    func post(adopting moving: MovingConnection) -> Bool {
        enqueue(CollectionOfOne(.adopt(moving)), unlessStopped: true)
    }

    /// The loop has stopped: it takes no more connections (`post(adopting:)` fails from
    /// now on). Returns the connections handed over that it had not run yet.
    func closeInbox() -> [MovingConnection] {
        inbox.withLock { inbox in
            inbox.open = false
            return inbox.tasks.compactMap { if case .adopt(let moving) = $0 { moving } else { nil } }
        }
    }

    /// Runs the tasks handed over by other threads (an input of the seam, ConnectionIO.swift).
    func runInbox() {
        activity &+= 1
        shim_eventfd_drain(wakeFD)
        let tasks = inbox.withLock { inbox in
            defer { inbox.tasks.removeAll(keepingCapacity: true) }
            return inbox.tasks
        }
        refreshTime()
        for task in tasks {
            switch task {
            case .wake(let ref):
                markDirty(ref.slot, generation: ref.generation)
            case .reply(let ref, let frame):
                postedReplies.append((ref, frame))
            case .close(let ref, let frame):
                // Replies posted before the close still go out first.
                sendPostedReplies()
                if table.isLive(ref.slot, generation: ref.generation) { closeConnection(ref.slot, with: frame) }
            case .watchWritable(let ref):
                if table.isLive(ref.slot, generation: ref.generation) { watchWritable(ref.slot) }
            case .bodiesLoaded(let ref):
                if table.isLive(ref.slot, generation: ref.generation) {
                    table.state(ref.slot).pointee.flags.remove(.bodiesRequested)
                    markDirty(ref.slot, generation: ref.generation)
                }
            case .drain:
                sendPostedReplies()
                beginDrain()
            case .released(let release):
                apply(context.switchboard.apply(release, wall: context.clock.wallMilliseconds()))
                var remoteReplies: [LoopTask] = []
                for reply in release.replies {
                    if case .reply(let ref, let frame) = reply, ref.loop == index {
                        postedReplies.append((ref, frame))
                    } else {
                        remoteReplies.append(reply)
                    }
                }
                LoopDispatch.post(remoteReplies, to: peers)
            case .adopt(let moving):
                adopt(moving)
            }
        }
        sendPostedReplies()
        flushDirty()
    }

    /// Writes the replies gathered from the inbox with one write per connection. The store
    /// writer posts a whole commit's OKs at once, mostly to a few busy senders: written
    /// one by one, they were a system call each, and a request arriving meanwhile waited
    /// behind all of them. Each connection's replies keep their order.
    private func sendPostedReplies() {
        guard !postedReplies.isEmpty else { return }
        if postedReplies.count > 1 {
            // By connection, then by position: a stable grouping.
            postedReplies = postedReplies.enumerated()
                .sorted { ($0.element.ref.slot, $0.offset) < ($1.element.ref.slot, $1.offset) }
                .map(\.element)
        }
        for (ref, frame) in postedReplies {
            guard table.isLive(ref.slot, generation: ref.generation), table.state(ref.slot).pointee.phase == .established else { continue }
            if replySlot != ref.slot {
                endReplies()
                beginReplies(to: ref.slot)
            }
            send(frame, to: ref.slot)
        }
        endReplies()
        postedReplies.removeAll(keepingCapacity: true)
    }

    func stopListening() {
        for event in [listenEvent, tlsListenEvent] { if let event { vs_event_free(event) } }
        listenEvent = nil
        tlsListenEvent = nil
        for fd in [listenFD, tlsListenFD] where fd >= 0 { close(fd) }
        listenFD = -1
        tlsListenFD = -1
    }

    func refreshTime() {
        nowInstant = context.clock.now()
        nowSeconds = context.seconds(at: nowInstant)
    }

    func reference(_ slot: UInt32) -> ConnectionRef {
        ConnectionRef(loop: index, slot: slot, generation: table.state(slot).pointee.generation)
    }

    /// Most remote wakes for one loop that this loop writes itself (`writeFromPeer`). A
    /// larger batch (a fan-out) is handed over, so that both loops write in parallel.
    static let peerWriteLimit = 8

    /// Carries out what the switchboard asked for: local wakes are coalesced; a few remote
    /// ones are written directly when their loop is idle, the rest are posted to their
    /// loops in one batch per loop.
    func apply(_ effects: [SwitchboardEffect]) {
        guard !effects.isEmpty else { return }
        var remote: [UInt16: [LoopTask]] = [:]
        var remoteWakes: [UInt16: [ConnectionRef]] = [:]
        for effect in effects {
            switch effect {
            case .wake(let ref):
                if ref.loop == index { markDirty(ref.slot, generation: ref.generation) } else { remoteWakes[ref.loop, default: []].append(ref) }
            case .close(let ref, let frame):
                context.counters.takeovers.increment()
                // A takeover (the device connected again) is always local on a server:
                // both connections are on the user's home loop. The post covers the rest.
                if ref.loop == index {
                    if table.isLive(ref.slot, generation: ref.generation) { closeConnection(ref.slot, with: frame) }
                } else {
                    remote[ref.loop, default: []].append(.close(ref, frame))
                }
            case .wakeUp:
                context.requestWakeUp(effect)
            }
        }
        for (loop, refs) in remoteWakes {
            let peer = peers[Int(loop)]
            let direct = refs.count <= Self.peerWriteLimit
            for ref in refs where !(direct && peer.writeFromPeer(ref)) {
                remote[loop, default: []].append(.wake(ref))
            }
        }
        for (loop, tasks) in remote { peers[Int(loop)].post(contentsOf: tasks) }
    }
}

/// Tasks handed to a loop (`EventLoop.post`), and whether it still runs them.
struct LoopInbox {
    var tasks: [LoopTask] = []
    /// False once the loop has stopped: a connection handed over then would never be run
    /// (`EventLoop.post(adopting:)` refuses it, and the sender closes it itself).
    var open = true
}

/// What `EventLoop.ownership` guards besides the loop's state itself.
struct LoopOwnership {
    /// False once the loop has released its connections: peers must not touch them.
    var running = true
    /// The loop's thread is asleep in epoll (or about to be) and runs no callback. Only
    /// then do peers write to its connections: a busy loop picks up a hand-off soon
    /// anyway, and coalesces many events for one connection into one write.
    var waiting = false
}

/// A server that cannot start.
public struct ServerError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}
