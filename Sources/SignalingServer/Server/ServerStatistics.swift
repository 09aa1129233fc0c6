import Synchronization

/// A snapshot of the server's counters.
public struct ServerStatistics: Sendable, Equatable {
    /// Connections currently open (any phase).
    public var openConnections = 0
    /// Connections that completed the handshake and are open.
    public var establishedConnections = 0
    public var acceptedConnections = 0
    public var handshakesCompleted = 0
    /// Handshakes refused with CLOSE overloaded by the handshake rate limit.
    public var handshakesThrottled = 0
    /// Connections refused by the per-address cap.
    public var connectionsRefusedPerAddress = 0
    /// Connections admitted without being counted against their address's cap: the
    /// per-address table had no room for the address (`AddressCounts`).
    public var connectionsUncountedPerAddress = 0
    public var idleTimeouts = 0
    public var handshakeTimeouts = 0
    /// Connections closed for a protocol violation.
    public var protocolErrors = 0
    public var slowConsumerCloses = 0
    /// The most bytes that ever waited in user space for one connection (its `outbound`):
    /// events beyond what the socket takes stay in the device's queue, so this stays near
    /// one batch (and below `--max-queued-bytes` plus a frame) whatever the backlogs.
    public var largestOutbound = 0
    public var takeovers = 0
    /// Event frames written to sockets (re-sends included).
    public var eventsWritten = 0
    public var requestsHandled = 0
    /// From the routing core.
    public var eventsQueued = 0
    public var eventsDropped = 0
    public var messagesAccepted = 0
    public var messagesDeduplicated = 0
    public var callsStarted = 0
    /// Messages and calls refused: the sender's share of a recipient's queue, its rate,
    /// the server's memory budget.
    public var refusedSenderQuota = 0
    public var refusedRate = 0
    public var refusedCapacity = 0
    /// Bytes held by undelivered events (what `--memory-budget` limits).
    public var eventBytes = 0
    /// False while the store fails or a commit is stalled: new messages and calls are
    /// refused at once (true without a store).
    public var storeHealthy = true
    /// Message bodies dropped from memory (the store keeps them) and read back from it.
    public var bodiesEvicted = 0
    public var bodiesRestored = 0
    public var sessionsExpired = 0
    public var eventsExpired = 0
    /// Of `openConnections`, `establishedConnections` and `acceptedConnections`: those on
    /// the TLS listener.
    public var openTLSConnections = 0
    public var establishedTLSConnections = 0
    public var acceptedTLSConnections = 0
    /// TLS handshakes completed in full, resumed from a session ticket, and failed
    /// (timeouts included; by reason in `/metrics`).
    public var tlsHandshakesFull = 0
    public var tlsHandshakesResumed = 0
    public var tlsHandshakesFailed = 0
    /// Relayed connections open on this node as the routing node of a cluster (a front
    /// holds their sockets), or, on a front, the connections it has announced to the home
    /// and not ended; and the relay frames received from fronts and sent to them.
    public var relayedConnections = 0
    /// Of `relayedConnections`: the devices that reached their front over TLS.
    public var relayedTLSConnections = 0
    public var relayFramesReceived = 0
    public var relayFramesSent = 0
}

/// The loops' counters, per loop: each event loop's thread writes its own cells (no
/// read-modify-write, no cache line shared with another loop), and a read sums them.
/// `StatisticsCounters` is what `SignalingServer.statistics`, the `stats` log line and
/// `/metrics` read; `ServerStatistics` stays the snapshot they see.
final class StatisticsCounters: Sendable {
    let openConnections: StripedCounter
    let establishedConnections: StripedCounter
    let acceptedConnections: StripedCounter
    let handshakesCompleted: StripedCounter
    let handshakesThrottled: StripedCounter
    let connectionsRefusedPerAddress: StripedCounter
    let connectionsUncountedPerAddress: StripedCounter
    let idleTimeouts: StripedCounter
    let handshakeTimeouts: StripedCounter
    let protocolErrors: StripedCounter
    let slowConsumerCloses: StripedCounter
    let largestOutbound: StripedCounter
    let takeovers: StripedCounter
    let eventsWritten: StripedCounter
    let requestsHandled: StripedCounter
    /// Of the connection counters above, those on the TLS listener; and TLS handshakes by result.
    let openTLSConnections: StripedCounter
    let establishedTLSConnections: StripedCounter
    let acceptedTLSConnections: StripedCounter
    let tlsHandshakesFull: StripedCounter
    let tlsHandshakesResumed: StripedCounter
    let tlsHandshakesFailed: StripedCounter
    /// As the routing node: connections relayed here; as a front: connections relayed by it
    /// (a server is one or the other). Of them, those whose device came over TLS.
    let relayedConnections: StripedCounter
    let relayedTLSConnections: StripedCounter
    let relayFramesReceived: StripedCounter
    let relayFramesSent: StripedCounter

    /// - Parameter loops: the number of event loops (`ServerConfiguration.workers`).
    init(loops: Int) {
        func counter(_ reading: StripedCounter.Reading = .sum) -> StripedCounter { StripedCounter(loops: loops, reading) }
        openConnections = counter()
        establishedConnections = counter()
        acceptedConnections = counter()
        handshakesCompleted = counter()
        handshakesThrottled = counter()
        connectionsRefusedPerAddress = counter()
        connectionsUncountedPerAddress = counter()
        idleTimeouts = counter()
        handshakeTimeouts = counter()
        protocolErrors = counter()
        slowConsumerCloses = counter()
        largestOutbound = counter(.maximum)
        takeovers = counter()
        eventsWritten = counter()
        requestsHandled = counter()
        openTLSConnections = counter()
        establishedTLSConnections = counter()
        acceptedTLSConnections = counter()
        tlsHandshakesFull = counter()
        tlsHandshakesResumed = counter()
        tlsHandshakesFailed = counter()
        relayedConnections = counter()
        relayedTLSConnections = counter()
        relayFramesReceived = counter()
        relayFramesSent = counter()
    }

    func snapshot(_ routing: SwitchboardCounters, eventBytes: Int) -> ServerStatistics {
        ServerStatistics(
            openConnections: openConnections.value,
            establishedConnections: establishedConnections.value,
            acceptedConnections: acceptedConnections.value,
            handshakesCompleted: handshakesCompleted.value,
            handshakesThrottled: handshakesThrottled.value,
            connectionsRefusedPerAddress: connectionsRefusedPerAddress.value,
            connectionsUncountedPerAddress: connectionsUncountedPerAddress.value,
            idleTimeouts: idleTimeouts.value,
            handshakeTimeouts: handshakeTimeouts.value,
            protocolErrors: protocolErrors.value,
            slowConsumerCloses: slowConsumerCloses.value,
            largestOutbound: largestOutbound.value,
            takeovers: takeovers.value,
            eventsWritten: eventsWritten.value,
            requestsHandled: requestsHandled.value,
            eventsQueued: routing.eventsQueued,
            eventsDropped: routing.eventsDropped,
            messagesAccepted: routing.messagesAccepted,
            messagesDeduplicated: routing.messagesDeduplicated,
            callsStarted: routing.callsStarted,
            refusedSenderQuota: routing.refusedSenderQuota,
            refusedRate: routing.refusedRate,
            refusedCapacity: routing.refusedCapacity,
            eventBytes: eventBytes,
            bodiesEvicted: routing.bodiesEvicted,
            bodiesRestored: routing.bodiesRestored,
            sessionsExpired: routing.sessionsExpired,
            eventsExpired: routing.eventsExpired,
            openTLSConnections: openTLSConnections.value,
            establishedTLSConnections: establishedTLSConnections.value,
            acceptedTLSConnections: acceptedTLSConnections.value,
            tlsHandshakesFull: tlsHandshakesFull.value,
            tlsHandshakesResumed: tlsHandshakesResumed.value,
            tlsHandshakesFailed: tlsHandshakesFailed.value,
            relayedConnections: relayedConnections.value,
            relayedTLSConnections: relayedTLSConnections.value,
            relayFramesReceived: relayFramesReceived.value,
            relayFramesSent: relayFramesSent.value)
    }
}

/// One counter split into a cell per event loop plus one for every other thread, summed
/// (or, for a high-water mark, maximised) when read.
///
/// A loop's thread finds its cell through the thread's current loop (`EventLoop.index`,
/// one thread-local load) and updates it with a relaxed load and store: it is the cell's
/// only writer, whichever loop's connection it is working for (a peer writing for another
/// loop counts in its own cell). Other threads share the last cell and update it with
/// atomic read-modify-writes. Every cell has a cache line to itself, so loops never bounce
/// a line between them. A gauge may be raised by one loop and lowered by another (a
/// connection accepted on one, closed by a peer): cells are signed, only the sum means
/// anything. Reading costs one load per loop.
final class StripedCounter: Sendable {
    enum Reading: Sendable {
        /// The value is the sum of the cells (counters, gauges).
        case sum
        /// The value is the largest cell (a high-water mark updated with `raise(to:)`).
        case maximum
    }

    private let cells: [PaddedCell]
    private let reading: Reading

    init(loops: Int, _ reading: Reading = .sum) {
        cells = (0...max(0, loops)).map { _ in PaddedCell() }
        self.reading = reading
    }

    /// The calling thread's cell and whether it is its only writer.
    @inline(__always)
    private var local: (cell: PaddedCell, exclusive: Bool) {
        let shared = cells.count - 1
        let index = EventLoop.onCurrentThread { Int($0.index) } ?? shared
        return index < shared ? (cells[index], true) : (cells[shared], false)
    }

    @inline(__always)
    func increment(by amount: Int = 1) {
        let (cell, exclusive) = local
        if exclusive {
            cell.storage.store(cell.storage.load(ordering: .relaxed) &+ amount, ordering: .relaxed)
        } else {
            cell.storage.add(amount, ordering: .relaxed)
        }
    }

    @inline(__always)
    func decrement(by amount: Int = 1) { increment(by: -amount) }

    /// Raises the calling thread's cell to `candidate` if that is larger (for `.maximum`).
    func raise(to candidate: Int) {
        let (cell, exclusive) = local
        var current = cell.storage.load(ordering: .relaxed)
        while candidate > current {
            if exclusive {
                cell.storage.store(candidate, ordering: .relaxed)
                return
            }
            let (exchanged, original) = cell.storage.compareExchange(expected: current, desired: candidate, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }

    var value: Int {
        switch reading {
        case .sum: cells.reduce(0) { $0 &+ $1.storage.load(ordering: .relaxed) }
        case .maximum: cells.reduce(0) { max($0, $1.storage.load(ordering: .relaxed)) }
        }
    }
}

/// An atomic integer alone on its cache line: 56 bytes of padding on each side (an object
/// of 136 bytes), so that no other object's bytes share the 64-byte line of `storage`.
final class PaddedCell: Sendable {
    private let leading: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0)
    let storage = Atomic<Int>(0)
    private let trailing: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0)
}

extension Atomic where Value == Int {
    func increment(by amount: Int = 1) { _ = add(amount, ordering: .relaxed) }
    func decrement(by amount: Int = 1) { _ = subtract(amount, ordering: .relaxed) }
}
