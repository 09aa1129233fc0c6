import CHiredisShims
import CLibeventShims
import SignalingStore
import SignalingSupport

/// The thread of a `RedisNodeLink`: one libevent `event_base` with the inbox's eventfd, a
/// periodic tick (timeouts, presence refresh, probes), a reconnect timer, a deferred
/// "tear down" event, and the two hiredis connections attached to it.
///
/// Lifecycle (`phase`): waiting → connecting → up → (failure) waiting → … ; stopping at
/// the end. A failure never closes a connection from inside one of hiredis's callbacks
/// (hiredis may still be using it): it records why and activates `teardownEvent`, whose
/// callback closes both connections, reports `.down` if the link was up, and arms the
/// reconnect timer with the back-off.
///
/// Concurrency: everything here is confined to the link's thread; other threads reach it
/// through `NodeLinkInbox` only. `@unchecked Sendable` only to hand it to its thread.
final class NodeLinkLoop: @unchecked Sendable {
    struct Settings: Sendable {
        let nodeID: String
        let endpoint: RedisEndpoint
        let presenceTTL: Duration
        let replyTimeout: Duration
    }

    enum Phase {
        /// Before the first connect, and between a failure and the next (back-off).
        case waiting
        /// Both connections opened; AUTH, SELECT or the SUBSCRIBE of the own and probe
        /// channels not confirmed yet.
        case connecting
        /// `.up` was delivered: packets flow.
        case up
        /// `stop`: deleting the presence key (bounded by the reply timeout), then the loop ends.
        case stopping
    }

    /// What a reply answers. Redis answers a connection's commands in order (pub/sub
    /// messages aside, which are told apart by their shape), so each connection keeps the
    /// replies it expects in a FIFO.
    enum Expected {
        /// AUTH or SELECT, named for the message: an error fails the attempt.
        case setup(String)
        /// One channel's SUBSCRIBE confirmation; `setup`: the own or probe channel, which
        /// the link waits for before `.up`.
        case subscribe(setup: Bool)
        case unsubscribe
        /// `sequence` numbers PUBLISHes in the order written (for coalescing `.undeliverable`).
        case publish(node: String, sequence: Int)
        case probe
        case presenceRefresh
        case presenceCheck(node: String)
        /// `PUBSUB NUMSUB` of a name's channel (`checkListener`).
        case listenerCheck(node: String)
        case presenceDelete
    }

    /// One hiredis connection and the replies it owes. The C callbacks get it unretained:
    /// it lives in `subscriber`/`publisher` until `closeConnections` has closed its handle,
    /// after which hiredis calls nothing.
    final class Connection {
        enum Role { case subscriber, publisher }
        let role: Role
        unowned let loop: NodeLinkLoop
        var handle: OpaquePointer?
        var isConnected = false
        let openedAt: Instant
        var expected = FIFOQueue<Expected>()
        /// Since when the connection has owed a reply without answering any: set when a
        /// command is queued on a connection that owed nothing, and at every reply. A
        /// deep queue of PUBLISHes is not a failure as long as Redis keeps answering; a
        /// Redis that stops answering is one, whatever the depth.
        var waitingSince: Instant?
        /// Setup replies still to come before the connection is ready.
        var setupPending = 0
        var isReady: Bool { isConnected && setupPending == 0 }

        init(role: Role, loop: NodeLinkLoop, openedAt: Instant) {
            self.role = role
            self.loop = loop
            self.openedAt = openedAt
        }
    }

    static let initialBackoff = Duration.milliseconds(100)
    static let maximumBackoff = Duration.seconds(5)
    /// Bytes of commands hiredis may hold unwritten (Redis reading slower than the node
    /// publishes) before the link gives up and says `down`, rather than grow without bound.
    static let maximumUnwritten = 64 << 20

    let settings: Settings
    let inbox: NodeLinkInbox
    let counters: NodeLinkCounters
    let handler: @Sendable (NodeLinkEvent) -> Void
    let logger: Logger
    let clock = SystemClock()

    private var base: OpaquePointer?
    private var wakeEvent: OpaquePointer?
    private var tickEvent: OpaquePointer?
    private var teardownEvent: OpaquePointer?
    private var reconnectEvent: OpaquePointer?

    private var phase = Phase.waiting
    private var subscriber: Connection?
    private var publisher: Connection?
    /// Why the current attempt failed, while `teardownEvent` is pending.
    private var failure: String?
    /// Failed attempts since the last `.up` (only the first is logged as a warning).
    private var failedAttempts = 0
    private var backoff = NodeLinkLoop.initialBackoff

    /// `listen(as:)` names (never the node's own id), subscribed at every connect.
    private var names: Set<String> = []
    /// The channels whose messages reach the handler: the own channel and the names'.
    /// A name given up stops at once, even before Redis confirms the UNSUBSCRIBE.
    private var listening: Set<[UInt8]> = []
    private let ownChannel: [UInt8]
    private let probeChannel: [UInt8]

    private var publishSequence = 0
    /// Nodes reported `.undeliverable`, with the last `publishSequence` written before the
    /// report: a later 0 for a packet written no later than that is the same news (the
    /// node reacts to the report after it, so it covers that packet) and is not repeated.
    /// Cleared for a node when a packet reaches it; at most one entry per unreachable name,
    /// and forgotten whole past 1,024 (a repeated report is harmless).
    private var undeliverableReported: [String: Int] = [:]

    private var nextPresenceRefresh = Instant(nanoseconds: 0)
    private var nextProbe = Instant(nanoseconds: 0)
    /// A probe was published and not heard back yet.
    private var probeInFlight = false
    /// When Redis answered the probe's PUBLISH (so the message was in our subscriber's
    /// output buffer): the subscriber must hear it, or anything, within the reply timeout.
    private var probeAnsweredAt: Instant?
    /// The last time the subscriber connection got anything (a message or a reply).
    private var subscriberHeardAt = Instant(nanoseconds: 0)
    /// The end of the wait for the presence key's DEL at a stop.
    private var stopDeadline: Instant?

    init(settings: Settings, inbox: NodeLinkInbox, counters: NodeLinkCounters, handler: @escaping @Sendable (NodeLinkEvent) -> Void, logger: Logger) {
        self.settings = settings
        self.inbox = inbox
        self.counters = counters
        self.handler = handler
        self.logger = logger
        ownChannel = Array(RedisNodeLink.channel(of: settings.nodeID, database: settings.endpoint.database).utf8)
        probeChannel = Array(RedisNodeLink.probeChannel(of: settings.nodeID, database: settings.endpoint.database).utf8)
        listening = [ownChannel]
    }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Runs on the link's thread until `stop`.
    func run() {
        guard let base = vs_event_base_new() else {
            logger.error("node_link_failed", ["node": settings.nodeID, "error": "cannot create an event base"])
            return
        }
        self.base = base
        wakeEvent = vs_event_new(base, inbox.wakeFD, Int16(VS_EV_READ | VS_EV_PERSIST), { _, _, argument in
            Unmanaged<NodeLinkLoop>.fromOpaque(argument!).takeUnretainedValue().takeInbox()
        }, unmanagedSelf)
        tickEvent = vs_event_new(base, -1, Int16(VS_EV_PERSIST), { _, _, argument in
            Unmanaged<NodeLinkLoop>.fromOpaque(argument!).takeUnretainedValue().tick()
        }, unmanagedSelf)
        teardownEvent = vs_event_new(base, -1, 0, { _, _, argument in
            Unmanaged<NodeLinkLoop>.fromOpaque(argument!).takeUnretainedValue().tearDown()
        }, unmanagedSelf)
        reconnectEvent = vs_event_new(base, -1, 0, { _, _, argument in
            Unmanaged<NodeLinkLoop>.fromOpaque(argument!).takeUnretainedValue().connect()
        }, unmanagedSelf)
        vs_event_add(wakeEvent, -1)
        // Every timeout is checked, and the presence key refreshed, to within a quarter of
        // the shorter of the reply timeout and the refresh interval.
        vs_event_add(tickEvent, max(1_000, (min(settings.replyTimeout, settings.presenceTTL / 3) / 4).microseconds))
        connect()

        vs_event_base_dispatch(base)

        closeConnections()
        for event in [wakeEvent, tickEvent, teardownEvent, reconnectEvent] { if let event { vs_event_free(event) } }
        vs_event_base_free(base)
        self.base = nil
    }

    // MARK: Connecting and failing

    private func connect() {
        guard phase == .waiting, let base else { return }
        phase = .connecting
        counters.connectAttempts.add(1, ordering: .relaxed)
        let now = clock.now()
        let endpoint = settings.endpoint
        guard let subscriber = open(.subscriber, base: base, now: now) else { return }
        self.subscriber = subscriber
        guard let publisher = open(.publisher, base: base, now: now) else { return }
        self.publisher = publisher

        // hiredis queues these until connect(2) completes; Redis answers them in order.
        if let password = endpoint.password {
            let auth = endpoint.username.map { RedisCommand("AUTH", $0, password) } ?? RedisCommand("AUTH", password)
            for connection in [subscriber, publisher] {
                connection.setupPending += 1
                send(auth, on: connection, at: now, expecting: .setup("the password"))
            }
        }
        if endpoint.database != 0 {
            publisher.setupPending += 1
            send(RedisCommand("SELECT", String(endpoint.database)), on: publisher, at: now, expecting: .setup("database \(endpoint.database)"))
        }
        var subscribe = RedisCommand("SUBSCRIBE")
        subscribe.append(ownChannel)
        subscribe.append(probeChannel)
        var expected: [Expected] = [.subscribe(setup: true), .subscribe(setup: true)]
        for name in names {
            subscribe.append(RedisNodeLink.channel(of: name, database: endpoint.database))
            expected.append(.subscribe(setup: false))
        }
        subscriber.setupPending += 2
        send(subscribe, on: subscriber, at: now, expecting: expected)
    }

    private func open(_ role: Connection.Role, base: OpaquePointer, now: Instant) -> Connection? {
        let connection = Connection(role: role, loop: self, openedAt: now)
        var error = [CChar](repeating: 0, count: 256)
        let handle = vs_redis_async_connect(
            base, settings.endpoint.host, Int32(settings.endpoint.port),
            { argument, connected, error in
                let connection = Unmanaged<Connection>.fromOpaque(argument!).takeUnretainedValue()
                connection.loop.connectionChanged(connection, connected: connected != 0, error: error.map { String(cString: $0) } ?? "")
            },
            { argument, reply, _ in
                let connection = Unmanaged<Connection>.fromOpaque(argument!).takeUnretainedValue()
                connection.loop.received(reply!, on: connection)
            },
            Unmanaged.passUnretained(connection).toOpaque(), &error, error.count)
        guard let handle else {
            fail("cannot connect to Redis at \(settings.endpoint.address): \(RedisConnection.text(error))")
            return nil
        }
        connection.handle = handle
        return connection
    }

    /// hiredis: the connection is up, or it failed or dropped (hiredis has let it go).
    private func connectionChanged(_ connection: Connection, connected: Bool, error: String) {
        if connected {
            connection.isConnected = true
            becomeUpIfReady()
        } else {
            fail("Redis at \(settings.endpoint.address) (\(connection.role) connection): \(error)")
        }
    }

    private func becomeUpIfReady() {
        guard phase == .connecting, subscriber?.isReady == true, publisher?.isReady == true else { return }
        phase = .up
        backoff = Self.initialBackoff
        logger.info("node_link_up", ["node": settings.nodeID, "redis": settings.endpoint.redacted, "failed_attempts": failedAttempts])
        failedAttempts = 0
        let now = clock.now()
        refreshPresence(now: now)
        nextProbe = now + settings.replyTimeout
        deliver(.up)
    }

    /// Records why the link cannot go on and tears it down once the current callback has
    /// returned (hiredis may be inside the connection that failed).
    private func fail(_ reason: String) {
        switch phase {
        case .connecting, .up:
            guard failure == nil else { return }
            failure = reason
            if let teardownEvent { vs_event_activate(teardownEvent, Int16(VS_EV_TIMEOUT)) }
        case .stopping:
            if let teardownEvent { vs_event_activate(teardownEvent, Int16(VS_EV_TIMEOUT)) }
        case .waiting:
            break
        }
    }

    private func tearDown() {
        closeConnections()
        if phase == .stopping {
            if let base { vs_event_base_loopbreak(base) }
            return
        }
        guard let reason = failure else { return }
        failure = nil
        let wasUp = phase == .up
        phase = .waiting
        // Packets sent before the node hears `down` are dropped now, not published after
        // the next `up`.
        takeInbox()
        guard phase == .waiting else { return }  // the inbox held a stop
        let delay = Duration.microseconds(Int64(Double(backoff.microseconds) * Double.random(in: 0.5...1.0)))
        backoff = min(backoff * 2, Self.maximumBackoff)
        failedAttempts += 1
        probeInFlight = false
        probeAnsweredAt = nil
        if wasUp {
            counters.outages.add(1, ordering: .relaxed)
            logger.warning("node_link_down", ["node": settings.nodeID, "reason": reason, "retry_ms": delay.milliseconds])
            deliver(.down(reason: reason))
        } else if failedAttempts == 1 {
            logger.warning("node_link_unreachable", ["node": settings.nodeID, "reason": reason, "retry_ms": delay.milliseconds])
        } else {
            logger.debug("node_link_unreachable", ["node": settings.nodeID, "reason": reason, "retry_ms": delay.milliseconds])
        }
        if let reconnectEvent { vs_event_add(reconnectEvent, delay.microseconds) }
    }

    /// Closes both connections; no hiredis callback runs during or after it.
    private func closeConnections() {
        for connection in [subscriber, publisher] {
            if let handle = connection?.handle { vs_redis_async_close(handle) }
            connection?.handle = nil
        }
        subscriber = nil
        publisher = nil
    }

    // MARK: Commands and replies

    private func send(_ command: RedisCommand, on connection: Connection, at now: Instant, expecting replies: Expected...) {
        send(command, on: connection, at: now, expecting: replies)
    }

    private func send(_ command: RedisCommand, on connection: Connection, at now: Instant, expecting replies: [Expected]) {
        guard let handle = connection.handle else { return }
        let queued = command.data.withUnsafeBufferPointer { data in
            command.lengths.withUnsafeBufferPointer { lengths in
                vs_redis_async_command(handle, 0, data.baseAddress, lengths.baseAddress, Int32(command.count))
            }
        }
        guard queued == 1 else {
            fail("Redis at \(settings.endpoint.address) (\(connection.role) connection): cannot queue a command")
            return
        }
        counters.commandsSent.add(1, ordering: .relaxed)
        if connection.expected.isEmpty { connection.waitingSince = now }
        for reply in replies { connection.expected.push(reply) }
    }

    /// hiredis: a reply, or (on the subscriber) a message.
    private func received(_ reply: OpaquePointer, on connection: Connection) {
        if connection.role == .subscriber {
            // Messages queued before a confirmation are progress too.
            subscriberHeardAt = clock.now()
            if connection.waitingSince != nil { connection.waitingSince = subscriberHeardAt }
            if deliverMessage(reply) { return }
        }
        guard let expected = connection.expected.pop() else {
            fail("Redis at \(settings.endpoint.address) sent a reply nobody asked for: \(RedisReply(copying: reply))")
            return
        }
        connection.waitingSince = connection.expected.isEmpty ? nil : clock.now()
        answer(expected, with: RedisReply(copying: reply), on: connection)
    }

    /// A pub/sub message (`message CHANNEL PAYLOAD`): a packet for the handler, or the
    /// link's own probe. False for anything else (a reply).
    private func deliverMessage(_ reply: OpaquePointer) -> Bool {
        guard vs_redis_reply_type(reply) == VS_REDIS_REPLY_ARRAY, vs_redis_reply_count(reply) == 3,
              let kind = vs_redis_reply_element(reply, 0), Self.bytes(kind).elementsEqual("message".utf8),
              let channelReply = vs_redis_reply_element(reply, 1), let payload = vs_redis_reply_element(reply, 2)
        else { return false }
        let channel = Self.bytes(channelReply)
        if channel.elementsEqual(probeChannel) {
            probeInFlight = false
            probeAnsweredAt = nil
            nextProbe = subscriberHeardAt + settings.replyTimeout
            return true
        }
        guard channel.elementsEqual(ownChannel) || listening.contains(Array(channel)) else { return true }
        let packet = Array(Self.bytes(payload))
        counters.packetsIn.add(1, ordering: .relaxed)
        counters.bytesReceived.add(packet.count, ordering: .relaxed)
        deliver(.packet(packet))
        return true
    }

    private static func bytes(_ reply: OpaquePointer) -> UnsafeBufferPointer<UInt8> {
        var length = 0
        let start = vs_redis_reply_bytes(reply, &length)
        return UnsafeBufferPointer(start: start, count: start == nil ? 0 : length)
    }

    private func answer(_ expected: Expected, with reply: RedisReply, on connection: Connection) {
        let address = settings.endpoint.address
        switch expected {
        case .setup(let what):
            if case .error(let message) = reply {
                fail("Redis at \(address) refused \(what): \(message)")
                return
            }
            connection.setupPending -= 1
            becomeUpIfReady()
        case .subscribe(let setup):
            guard case .array(let parts) = reply, parts.first?.text == "subscribe" else {
                fail("Redis at \(address): SUBSCRIBE answered \(reply)")
                return
            }
            if setup {
                connection.setupPending -= 1
                becomeUpIfReady()
            }
        case .unsubscribe:
            break
        case .publish(let node, let sequence):
            guard case .integer(let receivers) = reply else {
                fail("Redis at \(address): PUBLISH answered \(reply)")
                return
            }
            if receivers == 0 {
                counters.undeliverable.add(1, ordering: .relaxed)
                if let reported = undeliverableReported[node], sequence <= reported { return }
                if undeliverableReported.count >= 1_024 { undeliverableReported.removeAll() }
                undeliverableReported[node] = publishSequence
                deliver(.undeliverable(node: node))
            } else if !undeliverableReported.isEmpty {
                undeliverableReported[node] = nil
            }
        case .probe:
            guard case .integer(let receivers) = reply, receivers > 0 else {
                fail("Redis at \(address): nobody hears this node's probe channel (the subscription was lost): \(reply)")
                return
            }
            if probeInFlight { probeAnsweredAt = clock.now() }  // unless the subscriber heard it first
        case .presenceRefresh:
            if case .error(let message) = reply { fail("Redis at \(address) refused the presence key: \(message)") }
        case .presenceCheck(let node):
            guard case .integer(let exists) = reply else {
                fail("Redis at \(address): EXISTS answered \(reply)")
                return
            }
            if exists == 0 { deliver(.gone(node: node)) }
        case .listenerCheck(let node):
            // [channel, subscribers]. Redis runs this connection's commands in order, so a
            // PUBLISH written after this reply finds the same subscriber.
            guard case .array(let parts) = reply, parts.count == 2, case .integer(let subscribers) = parts[1] else {
                fail("Redis at \(address): PUBSUB NUMSUB answered \(reply)")
                return
            }
            if subscribers > 0 { deliver(.listening(node: node)) }
        case .presenceDelete:
            if phase == .stopping, let teardownEvent { vs_event_activate(teardownEvent, Int16(VS_EV_TIMEOUT)) }
        }
    }

    private func deliver(_ event: NodeLinkEvent) {
        guard phase != .stopping else { return }
        handler(event)
    }

    // MARK: Requests from other threads, and time

    private func takeInbox() {
        let taken = inbox.take()
        let now = clock.now()
        let database = settings.endpoint.database
        for request in taken.requests {
            switch request {
            case .packet(let bytes, let node):
                guard phase == .up, let publisher else {
                    counters.packetsDropped.add(1, ordering: .relaxed)
                    continue
                }
                publishSequence += 1
                var publish = RedisCommand("PUBLISH", RedisNodeLink.channel(of: node, database: database))
                publish.append(bytes)
                send(publish, on: publisher, at: now, expecting: .publish(node: node, sequence: publishSequence))
                counters.packetsOut.add(1, ordering: .relaxed)
                counters.bytesPublished.add(bytes.count, ordering: .relaxed)
            case .listen(let name):
                guard name != settings.nodeID, names.insert(name).inserted else { continue }
                let channel = RedisNodeLink.channel(of: name, database: database)
                listening.insert(Array(channel.utf8))
                if let subscriber, phase == .connecting || phase == .up {
                    send(RedisCommand("SUBSCRIBE", channel), on: subscriber, at: now, expecting: .subscribe(setup: false))
                }
            case .stopListening(let name):
                guard name != settings.nodeID, names.remove(name) != nil else { continue }
                let channel = RedisNodeLink.channel(of: name, database: database)
                listening.remove(Array(channel.utf8))
                if let subscriber, phase == .connecting || phase == .up {
                    send(RedisCommand("UNSUBSCRIBE", channel), on: subscriber, at: now, expecting: .unsubscribe)
                }
            case .checkListener(let node):
                // While down nobody can say, as for presence.
                guard phase == .up, let publisher else { continue }
                send(RedisCommand("PUBSUB", "NUMSUB", RedisNodeLink.channel(of: node, database: database)), on: publisher, at: now,
                     expecting: .listenerCheck(node: node))
            case .checkPresence(let nodes):
                // While down nobody can say: the caller asks again at its next interval.
                guard phase == .up, let publisher else { continue }
                for node in nodes {
                    send(RedisCommand("EXISTS", RedisNodeLink.presenceKey(of: node)), on: publisher, at: now, expecting: .presenceCheck(node: node))
                }
            }
        }
        // Written now rather than at the loop's next turn (an epoll round and a write
        // event armed and disarmed per batch): the packets are on the latency path.
        if phase == .up, let publisher, publisher.isConnected, let handle = publisher.handle { vs_redis_async_flush(handle) }
        if phase == .up, let handle = publisher?.handle, vs_redis_async_unwritten(handle) > Self.maximumUnwritten {
            fail("Redis at \(settings.endpoint.address) reads slower than this node publishes: more than \(Self.maximumUnwritten >> 20) MiB waiting")
        }
        if let deletingPresence = taken.stop, phase != .stopping { beginStop(deletingPresence: deletingPresence, now: now) }
    }

    private func beginStop(deletingPresence: Bool, now: Instant) {
        let wasUp = phase == .up
        phase = .stopping
        if let reconnectEvent { vs_event_del(reconnectEvent) }
        if deletingPresence, wasUp, let publisher {
            send(RedisCommand("DEL", RedisNodeLink.presenceKey(of: settings.nodeID)), on: publisher, at: now, expecting: .presenceDelete)
            stopDeadline = now + settings.replyTimeout
        } else if let teardownEvent {
            vs_event_activate(teardownEvent, Int16(VS_EV_TIMEOUT))
        }
    }

    private func tick() {
        let now = clock.now()
        let timeout = settings.replyTimeout
        switch phase {
        case .connecting, .up:
            for connection in [subscriber, publisher] {
                guard let connection else { continue }
                if !connection.isConnected, now - connection.openedAt > timeout {
                    fail("Redis at \(settings.endpoint.address) (\(connection.role) connection): not connected within \(timeout)")
                    return
                }
                if let waitingSince = connection.waitingSince, now - waitingSince > timeout {
                    fail("Redis at \(settings.endpoint.address) (\(connection.role) connection): no reply within \(timeout)")
                    return
                }
            }
            if let answered = probeAnsweredAt, now - max(answered, subscriberHeardAt) > timeout {
                fail("Redis at \(settings.endpoint.address): this node's probe was not heard back within \(timeout)")
                return
            }
            guard phase == .up, let publisher else { return }
            if now >= nextPresenceRefresh { refreshPresence(now: now) }
            if !probeInFlight, now >= nextProbe {
                probeInFlight = true
                var probe = RedisCommand("PUBLISH")
                probe.append(probeChannel)
                probe.append("probe")
                send(probe, on: publisher, at: now, expecting: .probe)
            }
        case .stopping:
            if let stopDeadline, now >= stopDeadline, let teardownEvent { vs_event_activate(teardownEvent, Int16(VS_EV_TIMEOUT)) }
        case .waiting:
            break
        }
    }

    /// One SET per third of the TTL, however many devices the node serves.
    private func refreshPresence(now: Instant) {
        guard let publisher else { return }
        let key = RedisNodeLink.presenceKey(of: settings.nodeID)
        send(RedisCommand("SET", key, "1", "PX", String(settings.presenceTTL.milliseconds)), on: publisher, at: now, expecting: .presenceRefresh)
        nextPresenceRefresh = now + settings.presenceTTL / 3
    }
}
