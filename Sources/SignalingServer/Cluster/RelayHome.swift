import SignalingProtocol
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// The routing node's side of relayed connections (docs/CLUSTER.md, "Relayed connections
// (home side)"; docs/ARCHITECTURE.md, "Relayed connections").
//
// Locks of this file, in the order they may be taken:
// - a loop's `ownership` (outermost, as everywhere);
// - `RelayDirectory.state`: a leaf, taken by the link's thread once per relay frame and by
//   a loop under its `ownership` when it opens, drains, hands over or releases a relayed
//   connection, each for a dictionary operation. No lock is taken under it: the wake-ups it
//   decides are posted (to a loop's lock-free `inbox`) after it is released. Timed
//   (`SharedLock.relayDirectory`).
// - `RelayHome.presence`, `RelayHome.loops`: leaves held for a copy.

/// A relayed connection's name on the home: the front's node id and the front's id for it
/// (unique while the front lives, RelayPacket.swift).
struct RelayKey: Hashable, Sendable {
    let front: String
    let connection: UInt64
}

/// What a front said about one of its connections, waiting for the loop that has it.
enum RelayInput: Sendable {
    case open(peer: String, tls: Bool)
    case data([UInt8])
    case closed
}

/// Where each relayed connection lives, and its inputs not yet handled: one mailbox per
/// connection, so that its inputs are handled in the order the front sent them whichever
/// loop has it, also while it moves to its user's home loop (a loop that no longer has it
/// never takes from the mailbox; the loop that takes it over drains what waited).
///
/// The mailbox is the order; the loop task `.relay(key)` is only a wake-up (at most one
/// outstanding per connection while its loop has not drained: `wakePosted`). A wake-up
/// that reaches a loop which no longer has the connection does nothing; the loop that
/// takes it over wakes itself if anything waits (`arrived`).
///
/// Cost: one dictionary entry per relayed connection (its key, whose front id is one
/// string per front shared by all its connections, its loop and slot), inputs only while
/// they wait; one hold per relay frame on the link's thread.
final class RelayDirectory: Sendable {
    enum Place: Equatable {
        /// `.open` waits in the mailbox of the loop chosen for it.
        case unopened
        /// Lives in this slot of `Entry.loop`.
        case open(slot: UInt32)
        /// Leaving its loop for its user's home loop: no loop takes its inputs until the
        /// home loop has taken it over.
        case moving
    }

    struct Entry {
        var loop: UInt16
        var place: Place = .unopened
        var inputs: [RelayInput] = []
        /// A `.relay` wake-up was posted to `loop` and that loop has not drained since.
        var wakePosted = false
    }

    private struct State {
        var entries: [RelayKey: Entry] = [:]
        /// The connections of each front (for `.reset`, `.gone` and the presence check).
        /// Its keys are also the fronts' interned ids (`interned`).
        var byFront: [String: Set<UInt64>] = [:]
        /// Where the next `.open` goes (round the loops).
        var nextLoop = 0

        /// `key` naming its front with the one copy of the front's id that `byFront`
        /// holds, if it has connections here: every packet decodes its sender's id into a
        /// string of its own (a heap allocation of about 64 bytes for `HOST/PID/RANDOM`),
        /// which an entry and its connection's `RelayIO` would otherwise keep per
        /// connection. One hash lookup.
        func interned(_ key: RelayKey) -> RelayKey {
            guard let index = byFront.index(forKey: key.front) else { return key }
            return RelayKey(front: byFront[index].key, connection: key.connection)
        }
    }

    private let state = Mutex(State())

    enum Delivery: Equatable {
        /// Post a `.relay` wake-up for the key to this loop: the key with the front's
        /// interned id (`State.byFront`), which whoever keeps it (the loop's `RelayIO`)
        /// shares.
        case wake(RelayKey, UInt16)
        /// Queued; a wake-up is already on its way.
        case queued
        /// No such connection: the front's connection is unknown (never opened, or
        /// forgotten since), or `.open` named one that exists.
        case unknown
        case duplicateOpen
    }

    /// Queues a front's input (the link's thread). An `.open` creates the entry on the next
    /// loop round (`loopCount` loops).
    func deliver(_ input: RelayInput, for key: RelayKey, loopCount: Int) -> Delivery {
        state.withLock(timing: .relayDirectory) { state in
            let key = state.interned(key)
            if case .open = input {
                guard state.entries[key] == nil else { return .duplicateOpen }
                let loop = UInt16(state.nextLoop % max(1, loopCount))
                state.nextLoop &+= 1
                state.entries[key] = Entry(loop: loop, inputs: [input], wakePosted: true)
                state.byFront[key.front, default: []].insert(key.connection)
                return .wake(key, loop)
            }
            guard state.entries[key] != nil else { return .unknown }
            state.entries[key]!.inputs.append(input)
            if state.entries[key]!.wakePosted { return .queued }
            state.entries[key]!.wakePosted = true
            return .wake(key, state.entries[key]!.loop)
        }
    }

    /// Queues `.closed` for every connection of `front` (nil: of every front). Returns the
    /// wake-ups to post.
    func closeAll(of front: String?) -> [(RelayKey, UInt16)] {
        state.withLock(timing: .relayDirectory) { state in
            let keys = front.map { front in (state.byFront[front] ?? []).map { RelayKey(front: front, connection: $0) } }
                ?? Array(state.entries.keys)
            var wakes: [(RelayKey, UInt16)] = []
            for key in keys {
                guard var entry = state.entries[key] else { continue }
                entry.inputs.append(.closed)
                if !entry.wakePosted {
                    entry.wakePosted = true
                    wakes.append((key, entry.loop))
                }
                state.entries[key] = entry
            }
            return wakes
        }
    }

    /// The inputs waiting for `key`, for `loop`, if that loop has the connection (or is to
    /// open it); nil otherwise.
    func take(_ key: RelayKey, loop: UInt16) -> (place: Place, inputs: [RelayInput])? {
        state.withLock(timing: .relayDirectory) { state in
            guard var entry = state.entries[key], entry.loop == loop, entry.place != .moving else { return nil }
            entry.wakePosted = false
            let inputs = entry.inputs
            entry.inputs = []
            state.entries[key] = entry
            return (entry.place, inputs)
        }
    }

    /// Puts back inputs a loop took and did not handle (the connection began to move),
    /// ahead of anything queued since.
    func putBack(_ inputs: ArraySlice<RelayInput>, for key: RelayKey) {
        state.withLock(timing: .relayDirectory) { state in state.entries[key]?.inputs.insert(contentsOf: inputs, at: 0) }
    }

    /// The connection opened in `slot` of `loop`.
    func opened(_ key: RelayKey, loop: UInt16, slot: UInt32) {
        state.withLock(timing: .relayDirectory) { state in
            state.entries[key]?.loop = loop
            state.entries[key]?.place = .open(slot: slot)
        }
    }

    /// The connection leaves its loop (`ConnectionIO.handOver`).
    func leaving(_ key: RelayKey) {
        state.withLock(timing: .relayDirectory) { state in
            state.entries[key]?.place = .moving
            state.entries[key]?.wakePosted = false
        }
    }

    /// The connection lives in `slot` of `loop` now (`ConnectionIO.takeOver`). True when
    /// inputs wait: the loop must wake itself for them.
    func arrived(_ key: RelayKey, loop: UInt16, slot: UInt32) -> Bool {
        state.withLock(timing: .relayDirectory) { state in
            guard var entry = state.entries[key] else { return false }
            entry.loop = loop
            entry.place = .open(slot: slot)
            // A wake-up posted while it moved may have gone to a loop that ignored it.
            entry.wakePosted = !entry.inputs.isEmpty
            state.entries[key] = entry
            return entry.wakePosted
        }
    }

    /// Forgets the connection (released, or never opened).
    func remove(_ key: RelayKey) {
        state.withLock(timing: .relayDirectory) { state in
            guard state.entries.removeValue(forKey: key) != nil else { return }
            state.byFront[key.front]?.remove(key.connection)
            if state.byFront[key.front]?.isEmpty == true { state.byFront[key.front] = nil }
        }
    }

    /// The fronts that have connections here.
    var fronts: [String] { state.withLock(timing: .relayDirectory) { Array($0.byFront.keys) } }

    var count: Int { state.withLock(timing: .relayDirectory) { $0.entries.count } }
}

/// The home's end of the relay: takes the link's events (`SignalingServer.receive`, on the
/// link's thread, never blocking: it decodes and posts to loops), sends each loop's packets
/// (`RelayIO.flush`), and checks that the fronts it has connections from are alive.
final class RelayHome: Sendable {
    let link: any NodeLink
    let directory = RelayDirectory()
    private let context: ServerContext
    private let loops = Mutex<[EventLoop]>([])
    /// Malformed packets and misdirected frames: one warn line a second at most.
    private let badPacketLog = LogThrottle()
    /// When the next presence check is due (loop 0's tick).
    private let presence = Mutex<Instant?>(nil)

    init(link: any NodeLink, context: ServerContext) {
        self.link = link
        self.context = context
    }

    /// The server's loops, once started (packets before that are dropped: a node listens
    /// as its lease owner id, the name fronts address, only once its server runs, and a
    /// front addresses it only once it has heard that it listens: `FrontRelay`).
    func attach(_ loops: [EventLoop]) {
        self.loops.withLock { $0 = loops }
    }

    func receive(_ event: NodeLinkEvent) {
        switch event {
        case .packet(let bytes):
            receivePacket(bytes)
        case .up, .listening:
            break
        case .down(let reason):
            // Bytes may have been lost either way: every relayed device is offline.
            let connections = directory.count
            if connections > 0 {
                context.logger.warning("relay_link_down", ["reason": reason, "connections": connections,
                    "detail": "every relayed connection is closed; its devices reconnect"])
            }
            wake(directory.closeAll(of: nil))
        case .undeliverable(let node), .gone(let node):
            // A front that is gone, or that no longer listens: its devices are offline.
            let wakes = directory.closeAll(of: node)
            if !wakes.isEmpty {
                context.logger.info("relay_front_gone", ["front": node, "connections": wakes.count])
            }
            wake(wakes)
        }
    }

    private func receivePacket(_ bytes: [UInt8]) {
        let packet: RelayPacket
        do {
            packet = try RelayPacket(decoding: bytes)
        } catch {
            logBadPacket("undecodable packet of \(bytes.count) bytes: \(error.message)", from: "-")
            return
        }
        context.counters.relayFramesReceived.increment(by: packet.frames.count)
        let loops = self.loops.withLock { $0 }
        guard !loops.isEmpty else { return }
        // The packet's wake-ups, posted once it is read: one inbox push per loop.
        var wakes: [(RelayKey, UInt16)] = []
        defer { wake(wakes, on: loops) }
        for frame in packet.frames {
            let key = RelayKey(front: packet.from, connection: frame.connection)
            let input: RelayInput
            switch frame {
            case .open(_, let peer, let tls): input = .open(peer: peer, tls: tls)
            case .data(_, let bytes): input = .data(bytes)
            case .closed: input = .closed
            case .reset:
                // The front starts over: it has forgotten every connection it relayed here.
                wakes += directory.closeAll(of: packet.from)
                continue
            case .finish, .release:
                logBadPacket("a home's frame (\(frame.kind)) sent to the home", from: packet.from)
                continue
            }
            switch directory.deliver(input, for: key, loopCount: loops.count) {
            case .wake(let key, let loop): wakes.append((key, loop))
            case .queued: break
            case .unknown:
                // Routine after a `.reset`, a lost link or a close of ours that crossed
                // the device's last bytes: the front closes the socket on its own side.
                context.logger.debug("relay_unknown_connection", ["front": packet.from, "connection": frame.connection])
            case .duplicateOpen:
                logBadPacket("open of connection \(frame.connection), which is open already", from: packet.from)
            }
        }
    }

    /// Posts the wake-ups, in order, one batch per loop (one inbox push, at most one
    /// eventfd write each).
    private func wake(_ wakes: [(RelayKey, UInt16)], on loops: [EventLoop]? = nil) {
        guard !wakes.isEmpty else { return }
        let loops = loops ?? self.loops.withLock { $0 }
        if wakes.count == 1 {
            let (key, loop) = wakes[0]
            if Int(loop) < loops.count { loops[Int(loop)].post(.relay(key, loop: loop)) }
            return
        }
        var byLoop = Array(repeating: [LoopTask](), count: loops.count)
        for (key, loop) in wakes where Int(loop) < loops.count { byLoop[Int(loop)].append(.relay(key, loop: loop)) }
        for (index, tasks) in byLoop.enumerated() where !tasks.isEmpty { loops[index].post(contentsOf: tasks) }
    }

    private func logBadPacket(_ reason: String, from front: String) {
        guard let suppressed = badPacketLog.admit(now: context.now()) else { return }
        context.logger.warning("relay_packet_dropped", ["front": front, "reason": reason, "suppressed": suppressed])
    }

    /// Sends one packet of `frames` to `front`.
    func send(_ frames: [RelayPacket.Frame], to front: String) {
        context.counters.relayFramesSent.increment(by: frames.count)
        link.send(RelayPacket(from: link.nodeID, frames: frames).encoded(), to: front)
    }

    /// Every `relayPresenceInterval` (loop 0's tick): asks the link which of the fronts
    /// that have connections here are gone (they come back as `.gone`, closing theirs).
    func checkPresenceIfDue(now: Instant) {
        let interval = context.configuration.relayPresenceInterval ?? context.configuration.storage.redisLeaseTTL
        let due = presence.withLock { next -> Bool in
            guard let scheduled = next else {
                next = now + interval
                return false
            }
            guard scheduled <= now else { return false }
            next = now + interval
            return true
        }
        guard due else { return }
        let fronts = directory.fronts
        if !fronts.isEmpty { link.checkPresence(of: fronts) }
    }

    /// The per-address cap's hash of a front's `peer` text (`203.0.113.7:51234`,
    /// `[2001:db8::7]:51234`, or an address without a port): the same hash as a direct
    /// connection from that address, so that a device counts once wherever it connects.
    static func addressHash(ofPeer peer: String) -> UInt64 {
        var host = Substring(peer)
        if host.hasPrefix("["), let end = host.firstIndex(of: "]") {
            host = host[host.index(after: host.startIndex)..<end]
        } else if host.filter({ $0 == ":" }).count == 1, let colon = host.firstIndex(of: ":") {
            host = host[..<colon]
        }
        var address = [UInt8](repeating: 0, count: 16)
        let text = String(host)
        if inet_pton(AF_INET, text, &address) == 1 {
            return UInt64(PeerAddress(bytes: Array(address[..<4]), port: 0).hash)
        }
        if inet_pton(AF_INET6, text, &address) == 1 {
            return UInt64(PeerAddress(bytes: address, port: 0).hash)
        }
        // Not an address (a front's own name for a device): its text stands for it.
        return UInt64(PeerAddress(bytes: Array(peer.utf8), port: 0).hash)
    }
}

/// The transport of a loop's relayed connections (ConnectionIO.swift): what the loop writes
/// to one is gathered during the loop's callback, per front, and sent as one packet per
/// front when the callback ends (`flush`). It takes every byte at once: the front writes
/// to the device's socket with back-pressure and applies the slow-consumer rule itself.
///
/// Loop-thread state, used under the loop's `ownership`.
final class RelayIO: ConnectionIO {
    /// One relayed connection's transport state; moves between loops with it.
    final class Connection {
        let key: RelayKey
        /// The device's address as the front saw it (log lines).
        let peer: String
        let tls: Bool
        /// `.finish` was sent: the release needs no `.release`.
        var finished = false

        init(key: RelayKey, peer: String, tls: Bool) {
            self.key = key
            self.peer = peer
            self.tls = tls
        }
    }

    let home: RelayHome
    private let loop: UInt16
    private var connections: [UInt32: Connection] = [:]
    /// Frames for each front (by node id) gathered during the current callback, in order.
    private var outbox = RelayOutbox<String>()

    init(home: RelayHome, loop: UInt16) {
        self.home = home
        self.loop = loop
    }

    var hasOutgoing: Bool { !outbox.isEmpty }

    func connection(in slot: UInt32) -> Connection? { connections[slot] }

    /// A new relayed connection in `slot`.
    func attach(_ connection: Connection, in slot: UInt32) {
        connections[slot] = connection
        home.directory.opened(connection.key, loop: loop, slot: slot)
    }

    /// A front's connection this loop has no slot for: told to end at once.
    func refuse(_ key: RelayKey, with close: Close) {
        end(key, with: close)
        home.directory.remove(key)
    }

    /// `close`, then `.finish`: the front writes the CLOSE and ends the stream.
    private func end(_ key: RelayKey, with close: Close) {
        append(.data(connection: key.connection, bytes: FrameEncoder.encode(.close(close))), for: key.front)
        append(.finish(connection: key.connection), for: key.front)
    }

    /// Sends what the callback gathered, one packet per front.
    func flush() {
        outbox.sendAll { front, frames in home.send(frames, to: front) }
    }

    private func append(_ frame: RelayPacket.Frame, for front: String) {
        outbox.append(frame, for: front)
    }

    func transmit(_ bytes: UnsafeRawBufferPointer, to slot: UInt32) -> IOResult {
        guard let connection = connections[slot], !connection.finished else { return .transferred(bytes.count) }
        outbox.appendData(bytes, connection: connection.key.connection, for: connection.key.front)
        return .transferred(bytes.count)
    }

    func watch(_ slot: UInt32, readable: Bool, writable: Bool) {
        // The front reads and writes the device's socket; nothing to watch here.
    }

    func finishWriting(_ slot: UInt32) {
        guard let connection = connections[slot], !connection.finished else { return }
        connection.finished = true
        append(.finish(connection: connection.key.connection), for: connection.key.front)
    }

    func release(_ slot: UInt32) {
        guard let connection = connections.removeValue(forKey: slot) else { return }
        forget(connection)
    }

    func handOver(_ slot: UInt32) -> AnyObject {
        let connection = connections.removeValue(forKey: slot)!
        home.directory.leaving(connection.key)
        return connection
    }

    func takeOver(_ moved: AnyObject, in slot: UInt32) {
        let connection = moved as! Connection
        connections[slot] = connection
        if home.directory.arrived(connection.key, loop: loop, slot: slot) {
            home.wakeLoop(loop, for: connection.key)
        }
    }

    /// A connection handed over that this loop could not take (no slot): it ends with
    /// `close` (its device gets it, then the end of the stream).
    func abandon(_ moved: AnyObject, with close: Close) {
        let connection = moved as! Connection
        if !connection.finished {
            end(connection.key, with: close)
            connection.finished = true
        }
        forget(connection)
    }

    private func forget(_ connection: Connection) {
        if !connection.finished { append(.release(connection: connection.key.connection), for: connection.key.front) }
        home.directory.remove(connection.key)
        home.connectionReleased(tls: connection.tls)
    }
}

extension RelayHome {
    func wakeLoop(_ loop: UInt16, for key: RelayKey) {
        wake([(key, loop)])
    }

    /// `voipserver_relayed_connections{transport}`: a relayed connection took a slot here
    /// (`tls`: its device reached its front over TLS), or gave it up.
    func connectionOpened(tls: Bool) {
        context.counters.relayedConnections.increment()
        if tls { context.counters.relayedTLSConnections.increment() }
    }

    func connectionReleased(tls: Bool) {
        context.counters.relayedConnections.decrement()
        if tls { context.counters.relayedTLSConnections.decrement() }
    }
}
