import CLibeventShims
import CLinuxShims
import SignalingCrypto
import SignalingProtocol
import SignalingSupport
import SignalingTLS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Locks of this file (docs/ARCHITECTURE.md, "Locks"), in the order they may be taken:
//
// - The loop's state (connections, buffers, deadlines) is its own thread's while the loop
//   runs (`ownsItself`, from the start of `run` until its last callback): its callbacks
//   take **no lock** (`owned`), like its routing shard (Switchboard.swift). Any other
//   thread that runs a callback then hands it to the loop (`LoopTask.ownerWork`) and
//   waits; no other loop ever does (each connection lives on its user's home loop, which
//   owns the user's shard, so no loop writes to another's connections).
// - `ownership`, the fallback lock: held for a whole callback while the loop's own thread
//   does not run it (a loop that never runs: embedded loops, tests, benchmarks; a loop
//   that has stopped, for its last callback and whoever comes after). Outermost: no lock
//   is held when it is taken.
// - Under `ownership` a loop may take, one at a time and each for a moment: its own
//   routing shard, with no lock while it runs (Switchboard.swift's top comment; another
//   shard's, or its own once it let go as it stops, under that shard's fallback lock);
//   in a hold only the `CallDirectory`'s overflow, for ids its lock-free table cannot
//   hold; the handshake holders
//   (`ServerContext`, once after each reload), a `LogThrottle`. The store writer's inbox,
//   a `DeferredReply`'s parts and the admission control (`AdmissionControl`) are no locks.
// Every hold of `ownership` is timed (`SharedLock.loopOwnership`); callbacks that take no
// lock are not. The loop's `inbox` is
// no lock: a lock-free queue (`MPSCQueue`) that any thread posts to, under any lock or
// none, and that only the loop takes from.

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
    /// A commit returned: release what it made durable in this loop's shard, then send
    /// its OKs to this loop's connections (each loop concerned gets the same release).
    case released(CommittedRelease, loop: UInt16)
    /// Steps of operations that span shards, for this loop's shard (`Switchboard.run`).
    case steps([PostedStep], loop: UInt16)
    /// This loop's shard's part of cancelling messages the store refused.
    case cancel(MessageCancellation)
    /// Bodies the store writer read back, for events of this loop's shard.
    case restoreBodies(BodiesReadBack)
    /// A connection whose HELLO another loop verified comes to live here, its user's home
    /// loop: register its device and handle what it sent after the HELLO
    /// (EventLoop+HandOver.swift). Posted only by `post(adopting:)`.
    case adopt(MovingConnection)
    /// Inputs from a front wait in the mailbox of this relayed connection
    /// (`RelayDirectory`): handle them if this loop has it (EventLoop+Relay.swift).
    case relay(RelayKey, loop: UInt16)
    /// Front mode: frames from the home for this loop's relayed connections
    /// (EventLoop+Front.swift).
    case relayed([RelayPacket.Frame])
    /// Front mode: the route to the home broke (`FrontRelay`); posted to every loop.
    case relayRouteChanged
    /// Work another thread (never a loop) handed to this loop while it runs and waits for
    /// (`OwnerWork`): a hold of its shard (`Switchboard.exclusiveElsewhere`: the admin
    /// API's, the push gateway's, a reload's), or a callback on its state (`owned`).
    case ownerWork(OwnerWork, loop: UInt16)

    /// The loop that runs it.
    var loop: UInt16 {
        switch self {
        case .wake(let ref), .close(let ref, _), .reply(let ref, _), .watchWritable(let ref), .bodiesLoaded(let ref):
            return ref.loop
        case .drain, .relayRouteChanged: return 0  // posted to each loop directly
        case .relayed(let frames): return frames.first.flatMap { ConnectionRef(packed: $0.connection)?.loop } ?? 0
        case .released(_, let loop), .steps(_, let loop), .relay(_, let loop), .ownerWork(_, let loop): return loop
        case .cancel(let part): return UInt16(part.shard)
        case .restoreBodies(let part): return UInt16(part.shard)
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
/// in a callback (`owned`): by the loop's own thread with no lock while it runs, else
/// under `ownership`; no other loop touches it (see the locks above).
/// libevent's event base is only ever called from the loop's own thread. Any thread may
/// call `post(_:)`: tasks go into a lock-free inbox and an eventfd wakes the loop. Loop `i`
/// owns routing shard `i`: the inbox is also how the steps of operations across shards,
/// and the store writer's work on that shard, reach it (`LoopTask.steps`, `.released`,
/// `.cancel`, `.restoreBodies`; docs/ARCHITECTURE.md, "Routing shards"). The class
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
    /// Tasks posted to the loop and not taken yet, first in, first out per poster: any
    /// thread pushes (`post`), only the loop takes (`runInbox`, `sendInboxReplies`,
    /// `closeInbox`). Lock-free: no poster ever waits for another or for the loop.
    private let inbox = MPSCQueue<LoopTask>()
    /// Tasks taken from `inbox` and not run yet, in posting order, ahead of anything still
    /// in `inbox` (loop thread only): `sendInboxReplies` takes the whole inbox to pick its
    /// replies out and leaves the rest here, for `runInbox` to run first. Its posters'
    /// eventfd write is still pending then (the push that found `inbox` empty wrote it
    /// after `runInbox` drained the eventfd). Empty otherwise, with the capacity of an
    /// earlier batch (`runInbox` reuses it).
    private var takenTasks: [LoopTask] = []
    /// The inbox holds tasks not taken yet: the loop sends the replies among them before
    /// it writes any events of its connections (`flushDirty`, `sendInboxReplies`), so a
    /// reply posted here goes out before any event that what it decided causes later for
    /// the same connection (the OK of CALL_INVITE, then CALL_RANG). One atomic load.
    var inboxHasTasks: Bool { !inbox.isEmpty }
    /// The loop thread is asleep in epoll_wait, or may go to sleep without looking at its
    /// inbox again: a poster whose push found the inbox empty writes the eventfd. False
    /// while the loop runs callbacks (set by `owned` on the loop's own thread): it looks at
    /// its inbox before it sleeps again (`prepareToSleep`), so a post meanwhile costs no
    /// system call on either side (the poster's write, the loop's epoll wake-up and
    /// drain). Under load that is most cross-loop posts: a step handed to a busy loop.
    ///
    /// The handshake that loses no wake-up (Dekker's): the loop stores true and then reads
    /// the inbox; a poster pushes and then reads this; both orders sequentially consistent,
    /// so at least one sees the other's write: the loop finds the task, or the poster wakes it.
    private let mayBeAsleep = Atomic<Bool>(true)
    /// Eventfd writes posters made to wake this loop (any thread; tests and benchmarks).
    let wakeUpsWritten = Atomic<Int>(0)
    /// Steps for other loops' shards handed on during the current callback, by destination
    /// loop (`postStep`): posted when the callback ends, one batch per loop (one inbox push,
    /// at most one eventfd write). Loop-thread state.
    private var outgoingSteps: [[PostedStep]] = []
    private var hasOutgoingSteps = false
    /// This loop runs steps of another loop's shard, whose owner has stopped
    /// (`postOutgoingSteps`): the one time a loop holds another shard (its fallback lock; see
    /// `Switchboard.assertOwnedByCaller`). Loop-thread state.
    var runsForeignWork = false
    /// The fallback lock: held for a callback while the loop's own thread does not run the
    /// loop (see the locks above).
    let ownership = Mutex(())
    /// The loop's own thread runs it (`beginOwnedRun` to `endOwnedRun`): its callbacks
    /// take no lock. Written only by that thread, under `ownership`, so that thread reads
    /// its own last write and any other thread that reads it under `ownership` sees
    /// whether the loop runs.
    private let ownsItself = Atomic<Bool>(false)
    /// This loop's copies of the handshake material a reload may replace (`Reloadable`).
    private var tokenVerifierCopy: Reloadable<TokenVerifier?>.Copy
    private var tlsContextCopy: Reloadable<TLSServerContext?>.Copy
    /// Set when the loop has been told to drain; holds the time by which it must be done.
    var drainDeadline: UInt32?
    /// Ticks run so far (read by `SignalingServer.awaitTicks`).
    let ticks = Atomic<Int>(0)
    /// Connections this loop holds open (read by `SignalingServer.openConnectionsPerLoop`).
    let openConnections = Atomic<Int>(0)
    /// Set when `run` has returned.
    let finished = Atomic<Bool>(false)
    /// What `/metrics` reports about this loop (updated in its callbacks, `owned`).
    let metrics = LoopMetrics()
    /// The transport of an embedded loop, whose connections are not sockets (tests); nil
    /// for a real loop, which calls the socket code directly (ConnectionIO.swift).
    let embeddedIO: (any ConnectionIO)?
    /// The transport of this loop's relayed connections (`ConnectionFlags.relayed`), when
    /// the server is the routing node of a cluster (`SignalingServer.enableRelay`).
    let relayIO: RelayIO?
    /// Front mode (EventLoop+Front.swift): the loop relays its connections' bytes to the
    /// home instead of running the protocol. Nil for a loop that serves devices itself.
    let frontRelay: LoopRelay?

    static let readBufferSize = 64 * 1024
    static let lingerSeconds: UInt32 = 2

    /// - Parameter embeddedIO: the transport of a loop without sockets (see `embeddedIO`):
    ///   it is never `run`; its owner calls the inputs (ConnectionIO.swift) itself.
    /// - Parameter connectionSlots: the connection table's capacity (smaller only in tests).
    init(
        index: UInt16, context: ServerContext, listenFD: Int32, tlsListenFD: Int32 = -1,
        embeddedIO: (any ConnectionIO)? = nil, relay: RelayHome? = nil, connectionSlots: Int = ConnectionTable.maximumSlots
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
        self.table = ConnectionTable(holdsTLS: tlsListenFD >= 0, capacity: connectionSlots)
        self.wakeFD = wakeFD
        self.embeddedIO = embeddedIO
        self.relayIO = relay.map { RelayIO(home: $0, loop: index) }
        self.frontRelay = context.front.map { LoopRelay(front: $0) }
        self.decoder = FrameDecoder(maxFrameLength: context.configuration.maxFrameLength, from: .client)
        self.readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.readBufferSize, alignment: 16)
        self.wheel = TimingWheel(startSecond: context.seconds(at: context.now()))
        self.tokenVerifierCopy = context.tokenVerifiers.copy()
        self.tlsContextCopy = context.tlsContexts.copy()
        scratch.reserveCapacity(Self.readBufferSize)
    }

    /// The token verifier in force (nil: no authentication), read once per handshake
    /// through this loop's copy: no lock unless a reload replaced it.
    var tokenVerifier: TokenVerifier? { context.tokenVerifiers.read(through: &tokenVerifierCopy) }

    /// The TLS context in force, read once per accepting callback through this loop's
    /// copy: no lock unless a reload replaced it.
    var tlsContext: TLSServerContext? { context.tlsContexts.read(through: &tlsContextCopy) }

    deinit {
        // A loop that never ran (an embedded one, or a start that failed) still owns its
        // event base; `run` frees it when it ends. The eventfd goes only now (see `wakeFD`).
        if !finished.load(ordering: .acquiring) { vs_event_base_free(base) }
        close(wakeFD)
        readBuffer.deallocate()
    }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Runs one libevent callback of this loop: with no lock on the loop's own thread while
    /// it runs, else under `ownership` (or, from another thread while the loop runs, on the
    /// loop's thread: `ownedElsewhere`).
    @inline(__always)
    func owned(_ callback: () -> Void) {
        // Awake: posts until the loop next prepares to sleep need not write the eventfd.
        // Only the loop's own thread may say so (tests and benchmarks run callbacks of a
        // loop from theirs while the loop itself sleeps).
        let onOwnThread = shim_current_loop() == unmanagedSelf
        if onOwnThread { mayBeAsleep.store(false, ordering: .relaxed) }
        if onOwnThread && ownsItself.load(ordering: .relaxed) {
            runCallback(callback)
        } else if !ownedElsewhere(callback) {
            return  // Run in one of the loop's own callbacks, which did the rest.
        }
        // After the callback (a system call). The switchboard borrowed, as on every path a
        // loop runs per callback or per event (`ServerContext.withSwitchboard`).
        if writerWakePending {
            writerWakePending = false
            context.withSwitchboard { $0.writer?.wake() }
        }
        // Loop 0 owns the store's deadline list: it lets go of the answered OKs as their
        // commits land (on its own thread only: tests and benchmarks run callbacks of a
        // loop from theirs).
        if index == 0, shim_current_loop() == unmanagedSelf {
            context.withSwitchboard { $0.writer?.dropSettledReplies(now: nowInstant) }
        }
    }

    /// A callback and what ends each one.
    @inline(__always)
    private func runCallback(_ callback: () -> Void) {
        callback()
        sharedAcknowledgementChain = nil
        if hasOutgoingSteps { postOutgoingSteps() }
        // A relayed connection's frames leave before it may move to another loop,
        // whose frames for it must follow them.
        if relayIO?.hasOutgoing == true { relayIO!.flush() }
        if let frontRelay, !frontRelay.outbox.isEmpty { sendRelayed() }
        // After the callback's reads: a plain socket's peeked bytes are taken by now,
        // and nothing below the read touches the connection any more.
        if !departing.isEmpty {
            handOverDeparting()
            if relayIO?.hasOutgoing == true { relayIO!.flush() }
        }
    }

    /// A callback on a thread that is not the running loop's own: under `ownership` when
    /// the loop's thread does not run it; while it runs, handed to it (`OwnerWork`, run
    /// in one of its callbacks) while this thread waits. A post the inbox refuses (it has
    /// just closed) means the loop let go first (`endOwnedRun`): `ownership` then.
    /// Returns whether the callback ran here (false: on the loop's thread).
    @inline(never)
    private func ownedElsewhere(_ callback: () -> Void) -> Bool {
        while true {
            let running = ownership.withLock(timing: .loopOwnership) { _ -> Bool in
                guard !ownsItself.load(ordering: .relaxed) else { return true }
                runCallback(callback)
                return false
            }
            guard running else { return true }
            assert(shim_current_loop() == nil, "a loop waited for loop \(index)")
            if OwnerWork.run(on: self, callback) { return false }
        }
    }

    /// The calling thread, this loop's own (`shim_set_current_loop` done), starts running
    /// it: from now on its callbacks take no lock, and it owns its routing shard
    /// (`Switchboard.claim`). `run` calls it, and so does a benchmark's thread that drives
    /// a loop (`FanOutScaling`). What other threads did before is published by the locks.
    func beginOwnedRun() {
        precondition(shim_current_loop() == unmanagedSelf, "loop \(index) claimed by a thread that is not its own")
        ownership.withLock { _ in ownsItself.store(true, ordering: .relaxed) }
        context.switchboard.claim(by: self)
    }

    /// Whether the loop's own thread has claimed the loop's state and its shard and not let
    /// go yet (`SignalingServer.start` waits for it).
    var runsOwned: Bool { ownsItself.load(ordering: .relaxed) }

    /// The loop's own thread lets go of the loop's state and of its shard: from now on
    /// every thread, this one too, takes `ownership` and the shard's fallback lock. Called
    /// before the inbox closes, so a refused post means the loop let go.
    func endOwnedRun() {
        context.switchboard.release(by: self)
        ownership.withLock { _ in ownsItself.store(false, ordering: .relaxed) }
    }

    /// The chain for the steps an ACK hands on (its receipts for other shards' senders, the
    /// rest of a long acknowledgement) that join no commit group (no store): one shared by
    /// the ACKs of a callback that share its wall-clock millisecond, made by the first, not
    /// one per ACK allocated here and freed by whichever loop runs its last step (a
    /// malloc, a free on another core and the reference counts per ACK; callgrind, issue
    /// 16). Safe to share: such a chain has no requester, no group and no message, so its
    /// count reaching 0 (perhaps more than once) decides and closes nothing
    /// (`Switchboard.finish`), and its steps need no clock (`ShardStep.needsClock`), only
    /// the wall time their events are stamped with. With a store each ACK's chain carries
    /// its own group: call `StepChain(now:wall:requester:group:)` then.
    func acknowledgementChain(now: @autoclosure () -> Instant, wall: UInt64) -> StepChain {
        if let shared = sharedAcknowledgementChain, shared.wall == wall { return shared }
        let chain = StepChain(now: now(), wall: wall, requester: nil, group: nil)
        sharedAcknowledgementChain = chain
        return chain
    }

    /// A cumulative ACK of `device` from its live connection `ref` (`EventLoop+Input`, and
    /// `FanOutScaling`'s devices): one hold of the device's shard, then its steps. With the
    /// shards owned by the loops, the hold hands its receipts for other shards' senders
    /// straight to this callback's outgoing steps (`AcknowledgementSteps`), and only what
    /// else it hands on (the next chunk, a receipt's copies in holds of their own) goes
    /// through `Switchboard.run`, in the same chain. The chain: without a store the
    /// callback's (`acknowledgementChain`); with one, the ACK's own, whose group commits the
    /// receipts with the acknowledgement. Returns the violation, if the ACK was one (the
    /// caller closes the connection).
    func acknowledge(_ device: DeviceRecord, connection ref: ConnectionRef, through seq: UInt64, wall: UInt64) -> ProtocolViolation? {
        // Borrowed: a copy of the reference is a write to the count every loop shares.
        context.withSwitchboard { switchboard in
            let shard = switchboard.shard(of: device.userID, connectedOn: self)
            let direct = switchboard.postsSteps(from: self)
            var steps = AcknowledgementSteps(loop: self, wall: wall)
            let (violation, next, group, effects) = switchboard.withState(shard: shard, wall: wall, writerWake: .afterCallback(of: self)) {
                board -> (ProtocolViolation?, [ShardStep], CommitGroup?, [SwitchboardEffect]) in
                var effects: [SwitchboardEffect] = []
                guard direct else {
                    let (violation, next) = board.ack(device, connection: ref, through: seq, into: &effects)
                    return (violation, next, board.group(for: next), effects)
                }
                let violation = board.ack(device, connection: ref, through: seq, handingOn: &steps, into: &effects)
                // With a chain made by a receipt, the rest joins it (and its group).
                return (violation, steps.rest, steps.chain == nil ? board.group(for: steps.rest) : nil, effects)
            }
            apply(effects)
            if !next.isEmpty {
                // Receipts for senders of other shards, committed with the acknowledgement
                // (without a store, in the chain of the callback's ACKs).
                let chain = steps.chain ?? group.map { StepChain(now: context.now(), wall: wall, requester: nil, group: $0) }
                    ?? acknowledgementChain(now: context.now(), wall: wall)
                apply(switchboard.run(next, chain: chain, on: self, writerWake: .afterCallback(of: self)).effects)
            }
            return violation
        }
    }

    /// What an ACK's hold hands on (`acknowledge`): its receipts for other shards' senders
    /// to the loop's outgoing steps (`postReceipt`), in a chain taken by the first receipt
    /// (without a store the callback's, `acknowledgementChain`; with one a chain of the
    /// ACK's own, with the group of the hold's commit unit), the rest kept in `rest` for
    /// `Switchboard.run`.
    struct AcknowledgementSteps: StepsHandedOn {
        // The loop whose thread runs the hold: it outlives it.
        unowned(unsafe) let loop: EventLoop
        let wall: UInt64
        private(set) var chain: StepChain?
        /// This acknowledgement's number (`EventLoop.nextAcknowledgementPosting`).
        private var number: UInt64 = 0
        private(set) var rest: [ShardStep] = []

        init(loop: EventLoop, wall: UInt64) {
            self.loop = loop
            self.wall = wall
        }

        mutating func handOn(_ step: ShardStep) { rest.append(step) }

        mutating func handOn(
            _ receipt: consuming ReceiptBatch.Receipt, for sender: String, shard: Int, in board: inout SwitchboardState
        ) {
            if chain == nil {
                chain = board.journaling
                    ? StepChain(now: loop.context.now(), wall: wall, requester: nil, group: board.operationGroup())
                    : loop.acknowledgementChain(now: loop.context.now(), wall: wall)
                number = loop.nextAcknowledgementPosting()
            }
            // Shard `i` is owned by loop `i` (`Switchboard.postsSteps`).
            loop.postReceipt(receipt, for: sender, toLoop: shard, chain: chain!, acknowledgement: number)
        }
    }

    /// Runs the loop on the calling thread until it has drained.
    func run() {
        shim_set_current_loop(unmanagedSelf)
        // From now until the inbox closes this thread alone touches the loop's state and
        // its shard, with no lock (Switchboard.swift's top comment).
        beginOwnedRun()
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

        // The loop and its shard are no thread's own from now on: a post the inbox refuses
        // sends its poster to the fallback locks, and what `closeInbox` runs here takes them.
        endOwnedRun()
        ownership.withLock { _ in
            // What was posted and not run: connections handed over still get their CLOSE,
            // steps and shard work are done here (`closeInbox`).
            refreshTime()
            closeInbox()
            for slot in table.liveSlots() { destroy(slot) }
            relayIO?.flush()
            table.deallocate()
        }
        stopListening()
        for event in [wakeEvent, tickEvent] { if let event { vs_event_free(event) } }
        vs_event_base_free(base)  // the eventfd stays open until deinit (see `wakeFD`)
        shim_set_current_loop(nil)
        finished.store(true, ordering: .releasing)
    }

    /// Loop 0's: whether devices are connecting in a ramp, judged at each tick.
    var connectionRamp = ConnectionRamp()
    /// When loop 0 next logs its statistics line (server seconds; 0 = not yet scheduled).
    var nextStatsSecond: UInt32 = 0
    /// Callbacks run so far; the busy-poll window restarts whenever it moves.
    var activity: UInt64 = 0
    /// A commit unit was queued during the current callback and the store writer must be
    /// woken once it ends (`Switchboard.WriterWake.afterCallback`). Loop-thread state.
    var writerWakePending = false
    /// The chain of the steps this callback's ACKs handed on without a store
    /// (`acknowledgementChain`); nil between callbacks. Loop-thread state.
    private var sharedAcknowledgementChain: StepChain?

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
            // Tasks posted while the loop ran its callbacks wrote no eventfd: run them now.
            if !prepareToSleep() {
                owned { runInbox() }
                continue
            }
            if window > .zero && clock.now() - lastActivity < window {
                if vs_event_base_loop(base, VS_EVLOOP_ONCE | VS_EVLOOP_NONBLOCK) < 0 { return }
            } else {
                if vs_event_base_loop(base, VS_EVLOOP_ONCE) < 0 { return }
            }
            if activity != seen {
                seen = activity
                lastActivity = clock.now()
            }
        }
    }

    /// Hands a task to this loop from any thread. Returns false when the loop has stopped
    /// and takes no tasks any more: work that must not be lost (steps, a shard's part of a
    /// release or a cancellation) is then done by the caller (`Switchboard.runOrphaned`).
    @discardableResult
    func post(_ task: LoopTask) -> Bool {
        post(contentsOf: CollectionOfOne(task))
    }

    @discardableResult
    func post(contentsOf tasks: some Collection<LoopTask>) -> Bool {
        guard !tasks.isEmpty else { return true }
        switch inbox.push(contentsOf: tasks) {
        case .refused:
            return false
        case .queuedFirst:
            // At most one eventfd write per batch: the push that found the inbox empty wakes
            // the loop, if it may be asleep; a loop that has not taken its inbox yet will see
            // later tasks anyway, and an awake one looks before it sleeps (`mayBeAsleep`).
            atomicMemoryFence(ordering: .sequentiallyConsistent)
            if mayBeAsleep.load(ordering: .sequentiallyConsistent) {
                shim_eventfd_signal(wakeFD)
                wakeUpsWritten.add(1, ordering: .relaxed)
            }
            return true
        case .queued:
            return true
        }
    }

    /// Called by the loop's thread before it may block waiting for events (epoll_wait, or a
    /// benchmark's poll of the eventfd): true when nothing waits, and from now on a post
    /// writes the eventfd; false when tasks wait (run them first: no eventfd write may
    /// have announced them). See `mayBeAsleep`.
    func prepareToSleep() -> Bool {
        mayBeAsleep.store(true, ordering: .sequentiallyConsistent)
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        return !hasPostedTasks
    }

    /// Tasks wait to be run, in the inbox or taken from it: what an embedded loop's owner
    /// (its only thread) checks instead of an epoll wait on the eventfd (ConnectionIO.swift).
    var hasPostedTasks: Bool { !inbox.isEmpty || !takenTasks.isEmpty }

    /// Hands `posted` to loop `destination`, the owner of its shard (this one included: a
    /// fan-out's or an ACK's next chunk), at the end of the current callback
    /// (`Switchboard.run`). Loop thread only.
    ///
    /// Receipts for the sender whose receipts were the last step handed to `destination`
    /// in this callback, in the same chain (the ACKs of one callback without a store:
    /// `acknowledgementChain`), join that step's batch (`PostedStep.absorb`, up to a chunk):
    /// the order of everything the loop runs is the same as with a step each, and a
    /// callback whose ACKs make receipts for one sender of another shard (each device of a
    /// fan-out acknowledging) hands on one step, not one per ACK (docs/LOAD-TESTING.md,
    /// "Routing on more cores").
    func postStep(_ posted: PostedStep, toLoop destination: Int) {
        if outgoingSteps.isEmpty { outgoingSteps = Array(repeating: [], count: peers.count) }
        let last = outgoingSteps[destination].endIndex - 1
        if last >= 0, outgoingSteps[destination][last].absorb(posted, upTo: SwitchboardState.ackChunk) { return }
        appendOutgoing(posted, toLoop: destination)
    }

    /// A receipt for `sender`, a user of the shard loop `destination` owns (another's),
    /// that the hold of acknowledgement `acknowledgement` (`AcknowledgementSteps`, a number
    /// of this loop's) made, handed on in `chain` as that ACK's steps were through `run`
    /// and `postStep`, without the steps, their arrays and `run` per ACK: it joins its
    /// sender's batch among the steps this acknowledgement handed that loop, or the step
    /// that was last before them when that is one (as `postStep` joins it), else starts a
    /// step of its own (counted in `chain`). So, as before, one step per sender and hold
    /// (at most a chunk of receipts each), each sender's receipts in order, and nothing
    /// else handed to that loop overtaken. Loop thread only.
    func postReceipt(
        _ receipt: consuming ReceiptBatch.Receipt, for sender: String, toLoop destination: Int, chain: StepChain,
        acknowledgement: UInt64
    ) {
        if outgoingSteps.isEmpty { outgoingSteps = Array(repeating: [], count: peers.count) }
        if receiptsFrom.isEmpty { receiptsFrom = Array(repeating: (0, 0), count: peers.count) }
        let end = outgoingSteps[destination].endIndex
        if receiptsFrom[destination].acknowledgement != acknowledgement {
            receiptsFrom[destination] = (acknowledgement, end - 1)
        }
        // From the newest back: a chunk's receipts go to one or a few senders.
        var index = end - 1
        while index >= max(0, receiptsFrom[destination].index) {
            if outgoingSteps[destination][index].isReceipts(of: sender, in: chain) {
                guard outgoingSteps[destination][index].hasRoom(for: 1, upTo: SwitchboardState.ackChunk) else { break }
                return outgoingSteps[destination][index].add(receipt)
            }
            index -= 1
        }
        chain.expect(1)
        let batch = ReceiptBatch(sender: sender, receipts: [receipt])
        appendOutgoing(PostedStep(step: .receipts(batch), chain: chain, shard: destination), toLoop: destination)
    }

    /// Acknowledgements whose hold handed receipts to `postReceipt` so far (their numbers).
    /// Loop-thread state.
    private var acknowledgementsPosting: UInt64 = 0
    /// By destination loop: the acknowledgement that last handed it a receipt, and the
    /// first step it may join there (`postReceipt`). Loop-thread state.
    private var receiptsFrom: [(acknowledgement: UInt64, index: Int)] = []

    /// A number for the next acknowledgement that hands receipts to `postReceipt`.
    func nextAcknowledgementPosting() -> UInt64 {
        acknowledgementsPosting &+= 1
        return acknowledgementsPosting
    }

    private func appendOutgoing(_ posted: PostedStep, toLoop destination: Int) {
        outgoingSteps[destination].append(posted)
        hasOutgoingSteps = true
        metrics.stepsPosted.add(1)
    }

    /// Posts the steps handed on during the callback, one batch per loop. A loop that has
    /// stopped takes none: this thread runs them (`Switchboard.runOrphaned`).
    private func postOutgoingSteps() {
        hasOutgoingSteps = false
        for destination in outgoingSteps.indices where !outgoingSteps[destination].isEmpty {
            // Moved out, not copied: the batch's buffer goes to the other loop whole, and the
            // next batch starts a small one. `removeAll(keepingCapacity:)` on the shared
            // buffer allocated a new one of the largest batch's capacity for every post.
            var steps: [PostedStep] = []
            swap(&steps, &outgoingSteps[destination])
            if peers[destination].post(.steps(steps, loop: UInt16(destination))) { continue }
            runsForeignWork = true
            let (replies, effects) = context.switchboard.runOrphaned(steps)
            runsForeignWork = false
            LoopDispatch.post(replies, to: peers)
            apply(effects)
            flushDirty()
        }
    }

    /// Hands a connection to this loop, its user's home loop (`LoopTask.adopt`). False when
    /// the loop has stopped and will run no more tasks: the caller keeps the connection.
    func post(adopting moving: MovingConnection) -> Bool {
        post(.adopt(moving))
    }

    /// Runs the tasks handed over by other threads (the wake-up eventfd fired; an input of
    /// the seam, ConnectionIO.swift).
    func runInbox() {
        activity &+= 1
        shim_eventfd_drain(wakeFD)
        // Tasks taken earlier (`sendInboxReplies`) were posted before anything still in
        // the inbox: they run first. The buffer goes back to `takenTasks` afterwards, so
        // that a batch allocates no array, unless a task's work took more from the inbox
        // meanwhile (those wait there for the next run, which their eventfd write causes).
        var tasks: [LoopTask] = []
        swap(&tasks, &takenTasks)
        inbox.takeAll(appendingTo: &tasks)
        defer {
            if takenTasks.isEmpty {
                tasks.removeAll(keepingCapacity: true)
                takenTasks = tasks
            }
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
            case .released(let release, _):
                apply(context.withSwitchboard {
                    $0.apply(release, shard: Int(index), wall: context.wallMilliseconds(), writerWake: .afterCallback(of: self))
                })
                for reply in release.replies {
                    if case .reply(let ref, let frame) = reply, ref.loop == index { postedReplies.append((ref, frame)) }
                }
            case .steps(let steps, _):
                let (replies, effects) = context.withSwitchboard { $0.runPosted(steps, on: self) }
                // The answers leave before the effects are carried out: what those effects
                // cause later for the requesting connection cannot overtake its answer
                // (see `inboxHasTasks`).
                var remoteReplies: [LoopTask] = []
                for reply in replies {
                    if case .reply(let ref, let frame) = reply, ref.loop == index {
                        postedReplies.append((ref, frame))
                    } else {
                        remoteReplies.append(reply)
                    }
                }
                LoopDispatch.post(remoteReplies, to: peers)
                apply(effects)
            case .cancel(let part):
                context.switchboard.cancel(part, loops: peers, writerWake: .afterCallback(of: self))
            case .restoreBodies(let part):
                context.switchboard.writer?.restore(part)
            case .adopt(let moving):
                adopt(moving)
            case .relay(let key, _):
                runRelayInputs(key)
            case .relayed(let frames):
                handleRelayed(frames)
            case .relayRouteChanged:
                relayRouteChanged()
            case .ownerWork(let work, _):
                work.run()
            }
        }
        sendPostedReplies()
        flushDirty()
    }

    /// When `run` stops (under `ownership`, after `endOwnedRun`, before the loop's
    /// connections are released):
    /// closes the inbox, so that `post` fails from now on and the poster does the work
    /// itself, and does the work posted to it that must not be lost on this thread: steps,
    /// and this loop's shard's part of a release or a cancellation, with holds of the shards
    /// like any thread that is not their owner; a connection handed over gets its CLOSE
    /// (goingAway) here. Other tasks concerned this loop's connections, which are closing.
    func closeInbox() {
        // The rule that makes a refused post safe: the loop let go of its state and its
        // shard before its inbox closes (`endOwnedRun`), so whoever finds it closed takes
        // the fallback locks, and what runs here takes them too.
        assert(!ownsItself.load(ordering: .relaxed), "loop \(index) closes its inbox while it still owns its state")
        assert(!context.switchboard.isOwned(by: self), "loop \(index) closes its inbox while it still owns its shard")
        var tasks: [LoopTask] = []
        swap(&tasks, &takenTasks)
        inbox.close(appendingTo: &tasks)
        let switchboard = context.switchboard
        let wall = context.wallMilliseconds()
        for task in tasks {
            switch task {
            case .steps(let steps, _):
                let (replies, effects) = switchboard.runOrphaned(steps)
                LoopDispatch.post(replies + LoopDispatch.tasks(for: effects, context: context), to: peers)
            case .released(let release, _):
                let effects = switchboard.apply(release, shard: Int(index), wall: wall)
                LoopDispatch.post(LoopDispatch.tasks(for: effects, context: context), to: peers)
            case .cancel(let part):
                switchboard.cancel(part, loops: peers)
            case .restoreBodies(let part):
                switchboard.writer?.restore(part)
            case .adopt(let moving):
                adopt(moving, closingWith: drainClose)
            case .ownerWork(let work, _):
                // Its waiter blocks until it has run: under the fallback lock now.
                work.run()
            case .wake, .close, .reply, .watchWritable, .bodiesLoaded, .drain, .relay, .relayed, .relayRouteChanged:
                continue
            }
        }
    }

    /// Sends the replies waiting in the inbox now, ahead of its other tasks (which keep
    /// their order and run when the loop next runs its inbox): called before the loop
    /// writes events (`flushDirty`), possibly while it collects a connection's replies
    /// (`consume`), so it runs nothing that could close a connection. Cost: one pass over
    /// the tasks newly taken from the inbox (those taken before hold no replies any more),
    /// only when it holds tasks. Loop thread only.
    func sendInboxReplies() {
        let start = takenTasks.endIndex
        guard inbox.takeAll(appendingTo: &takenTasks) else { return }
        // A stable partition of the new tasks: the replies go, the others keep their order.
        var kept = start
        for position in start..<takenTasks.endIndex {
            if case .reply(let ref, let frame) = takenTasks[position] {
                postedReplies.append((ref, frame))
            } else {
                takenTasks.swapAt(kept, position)
                kept += 1
            }
        }
        guard kept < takenTasks.endIndex else { return }
        takenTasks.removeSubrange(kept...)
        sendPostedReplies()
    }

    /// Writes the replies gathered from the inbox with one write per connection. The store
    /// writer posts a whole commit's OKs at once, mostly to a few busy senders: written
    /// one by one, they were a system call each, and a request arriving meanwhile waited
    /// behind all of them. Each connection's replies keep their order.
    private func sendPostedReplies() {
        guard !postedReplies.isEmpty else { return }
        // By connection, then by position: a stable grouping. A commit's OKs mostly go to
        // one sender, already grouped: the sort (three arrays and a copy of every reply)
        // only when a connection's replies are not together yet.
        if postedReplies.count > 1, !postedReplies.indices.dropFirst().allSatisfy({ postedReplies[$0 - 1].ref.slot <= postedReplies[$0].ref.slot }) {
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
            logIfRefusedByLimit(frame, on: ref.slot)
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
        nowInstant = context.now()
        nowSeconds = context.seconds(at: nowInstant)
    }

    func reference(_ slot: UInt32) -> ConnectionRef {
        ConnectionRef(loop: index, slot: slot, generation: table.state(slot).pointee.generation)
    }

    /// Carries out what the switchboard asked for: local wakes are coalesced; a wake or a
    /// close for another loop's connection (possible only when the loops do not own the
    /// shards: a `Switchboard` built apart from its loops) is posted to that loop, one
    /// batch per loop. No loop ever writes to another's connections.
    func apply(_ effects: [SwitchboardEffect]) {
        guard !effects.isEmpty else { return }
        var remote: [UInt16: [LoopTask]] = [:]
        for effect in effects {
            switch effect {
            case .wake(let ref):
                if ref.loop == index { markDirty(ref.slot, generation: ref.generation) } else { remote[ref.loop, default: []].append(.wake(ref)) }
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
        for (loop, tasks) in remote { peers[Int(loop)].post(contentsOf: tasks) }
    }
}

/// A server that cannot start.
public struct ServerError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}
