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
    /// Writes of events made by the loop that routed them, straight to an idle
    /// connection owned by another loop (no hand-off to that loop's thread).
    public var crossLoopWrites = 0
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
}

/// The loops' counters: relaxed atomics, written by loop threads, read by anyone.
final class StatisticsCounters: Sendable {
    let openConnections = Atomic<Int>(0)
    let establishedConnections = Atomic<Int>(0)
    let acceptedConnections = Atomic<Int>(0)
    let handshakesCompleted = Atomic<Int>(0)
    let handshakesThrottled = Atomic<Int>(0)
    let connectionsRefusedPerAddress = Atomic<Int>(0)
    let idleTimeouts = Atomic<Int>(0)
    let handshakeTimeouts = Atomic<Int>(0)
    let protocolErrors = Atomic<Int>(0)
    let slowConsumerCloses = Atomic<Int>(0)
    let largestOutbound = Atomic<Int>(0)
    let takeovers = Atomic<Int>(0)
    let eventsWritten = Atomic<Int>(0)
    let crossLoopWrites = Atomic<Int>(0)
    let requestsHandled = Atomic<Int>(0)
    let openTLSConnections = Atomic<Int>(0)
    let establishedTLSConnections = Atomic<Int>(0)
    let acceptedTLSConnections = Atomic<Int>(0)
    let tlsHandshakesFull = Atomic<Int>(0)
    let tlsHandshakesResumed = Atomic<Int>(0)
    let tlsHandshakesFailed = Atomic<Int>(0)

    func snapshot(_ routing: SwitchboardCounters, eventBytes: Int) -> ServerStatistics {
        ServerStatistics(
            openConnections: openConnections.load(ordering: .relaxed),
            establishedConnections: establishedConnections.load(ordering: .relaxed),
            acceptedConnections: acceptedConnections.load(ordering: .relaxed),
            handshakesCompleted: handshakesCompleted.load(ordering: .relaxed),
            handshakesThrottled: handshakesThrottled.load(ordering: .relaxed),
            connectionsRefusedPerAddress: connectionsRefusedPerAddress.load(ordering: .relaxed),
            idleTimeouts: idleTimeouts.load(ordering: .relaxed),
            handshakeTimeouts: handshakeTimeouts.load(ordering: .relaxed),
            protocolErrors: protocolErrors.load(ordering: .relaxed),
            slowConsumerCloses: slowConsumerCloses.load(ordering: .relaxed),
            largestOutbound: largestOutbound.load(ordering: .relaxed),
            takeovers: takeovers.load(ordering: .relaxed),
            eventsWritten: eventsWritten.load(ordering: .relaxed),
            crossLoopWrites: crossLoopWrites.load(ordering: .relaxed),
            requestsHandled: requestsHandled.load(ordering: .relaxed),
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
            openTLSConnections: openTLSConnections.load(ordering: .relaxed),
            establishedTLSConnections: establishedTLSConnections.load(ordering: .relaxed),
            acceptedTLSConnections: acceptedTLSConnections.load(ordering: .relaxed),
            tlsHandshakesFull: tlsHandshakesFull.load(ordering: .relaxed),
            tlsHandshakesResumed: tlsHandshakesResumed.load(ordering: .relaxed),
            tlsHandshakesFailed: tlsHandshakesFailed.load(ordering: .relaxed))
    }
}

extension Atomic where Value == Int {
    func increment(by amount: Int = 1) { _ = add(amount, ordering: .relaxed) }
    func decrement(by amount: Int = 1) { _ = subtract(amount, ordering: .relaxed) }
    /// Raises the value to `candidate` if that is larger (a high-water mark).
    func raise(to candidate: Int) {
        var current = load(ordering: .relaxed)
        while candidate > current {
            let (exchanged, original) = compareExchange(expected: current, desired: candidate, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }
}
