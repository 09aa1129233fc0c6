import CLibeventShims
import SignalingProtocol
import SignalingSupport

extension EventLoop {
    /// Runs every `tickInterval`: expires what is due. Idle connections cost nothing here
    /// unless their wheel slot comes round (once per idle-timeout period).
    func tick() {
        refreshTime()
        let now = nowSeconds
        while let due = helloDeadlines.first, due.deadline <= nowInstant {
            helloDeadlines.pop()
            forgetProxiedPeer(due.slot, generation: due.generation)
            guard table.isLive(due.slot, generation: due.generation),
                  table.state(due.slot).pointee.phase == .awaitingHello
            else { continue }
            if isHeldForRoute(due.slot, generation: due.generation) {
                closeConnection(due.slot, with: heldTooLong())
                continue
            }
            context.counters.handshakeTimeouts.increment()
            let flags = table.state(due.slot).pointee.flags
            let inTLSHandshake = flags.contains(.tls) && !isTLSEstablished(due.slot)
            if inTLSHandshake { recordTLSHandshakeFailure(.timeout) }
            // A front's relayed connection waits here for the home's first bytes.
            let missing = flags.contains(.awaitingProxyHeader) ? "PROXY header" : inTLSHandshake ? "TLS handshake"
                : frontRelay != nil ? "HELLO answered" : "HELLO"
            closeConnection(due.slot, with: Close(
                code: .handshakeTimeout, retryAfterMs: 1_000, retryJitterMs: 5_000,
                message: "no \(missing) within \(context.configuration.handshakeTimeout.wholeSecondsRoundedUp) s"))
        }
        while let due = closingDeadlines.first, due.deadline <= now {
            closingDeadlines.pop()
            if table.isLive(due.slot, generation: due.generation) { destroy(due.slot) }
        }
        for key in wheel.advance(to: now) {
            if key & Self.stallCheckKeyBit != 0 { visitStallCheck(key) } else { visitIdleDeadline(key) }
        }

        // The routing core's deadlines (ring timeouts, call grace, session expiry): each
        // shard's are run by the loop that owns it, a bounded number per hold; with the
        // shards not owned by the loops (one shard), loop 0 runs them all.
        let switchboard = context.switchboard
        let ownShard = switchboard.owner(of: Int(index), among: peers) === self
        for shard in ownShard ? [Int(index)] : index == 0 ? Array(0..<switchboard.shardCount) : [] {
            expire(shard: shard)
        }
        // For loop 0's `stats` line, which waits for no other loop.
        if ownShard { switchboard.publishCounters(by: self) }
        if index == 0 {
            // The store's deadlines too: the writer thread may be stuck in a write. Both
            // supervisors of thread priorities give way to a ramp of connections.
            let instant = context.now()
            let ramping = connectionRamp.observe(handshakes: context.counters.handshakesCompleted.value, now: instant)
            context.switchboard.writer?.superviseCommits(now: instant, connectionsRamping: ramping)
            context.loopPriority?.observe(now: instant, ramping: ramping)
            logStatisticsIfDue(now)
            relayIO?.home.checkPresenceIfDue(now: nowInstant)
        }
        flushDirty()
        if let deadline = drainDeadline, table.liveCount == 0 || now >= deadline {
            vs_event_base_loopbreak(base)
        }
        ticks.add(1, ordering: .releasing)
    }

    /// Runs shard `shard`'s due deadlines, `SwitchboardState.expiryBudget` per hold, until
    /// none is left; what they hand on to other shards (a call's ending for its other
    /// party) goes to those shards' owners as steps.
    private func expire(shard: Int) {
        let instant = context.now()
        var moreDue = true
        while moreDue {
            let wall = context.wallMilliseconds()
            let (pass, effects) = context.switchboard.withState(shard: shard, wall: wall, writerWake: .afterCallback(of: self)) { board in
                var effects: [SwitchboardEffect] = []
                return (board.expire(now: instant, into: &effects), effects)
            }
            moreDue = pass.moreDue
            apply(effects)
            let chain = StepChain(now: instant, wall: wall, requester: nil, group: nil)
            apply(context.switchboard.run(pass.next, chain: chain, on: self, writerWake: .afterCallback(of: self)).effects)
        }
    }

    /// One `stats` line every `statsInterval` (loop 0 only), so operators see the load in
    /// the log without a metrics system.
    private func logStatisticsIfDue(_ now: UInt32) {
        let interval = context.configuration.statsInterval
        guard interval > .zero, context.logger.enabled(.info) else { return }
        if nextStatsSecond == 0 { nextStatsSecond = now + interval.wholeSecondsRoundedUp }
        guard now >= nextStatsSecond else { return }
        nextStatsSecond = now + interval.wholeSecondsRoundedUp
        let stats = context.counters.snapshot(context.switchboard.countersWithoutWaiting, eventBytes: context.switchboard.eventBytes)
        context.logger.info("stats", [
            "connections": stats.openConnections, "established": stats.establishedConnections,
            "handshakes": stats.handshakesCompleted, "throttled": stats.handshakesThrottled,
            "idle_timeouts": stats.idleTimeouts, "protocol_errors": stats.protocolErrors,
            "events_queued": stats.eventsQueued, "events_written": stats.eventsWritten,
            "events_dropped": stats.eventsDropped, "messages": stats.messagesAccepted, "event_bytes": stats.eventBytes,
            "refused_sender_quota": stats.refusedSenderQuota, "refused_rate": stats.refusedRate,
            "refused_capacity": stats.refusedCapacity, "slow_consumers": stats.slowConsumerCloses,
            "calls": stats.callsStarted, "store_failures": context.switchboard.writer?.failedCommits.load(ordering: .relaxed) ?? 0,
            "store_commits": context.switchboard.writer?.commits.load(ordering: .relaxed) ?? 0,
            "store_changes_skipped": context.switchboard.writer?.compactedChanges.load(ordering: .relaxed) ?? 0,
        ])
    }

    /// The idle-timeout wheel holds at most one entry per connection slot, whoever holds
    /// the slot (`ConnectionState.inWheel`): a connection that closes leaves its entry to
    /// the slot's next connection instead of leaving a stale one behind (one per
    /// connect, kept for the whole idle timeout, was a linear memory growth under
    /// reconnect churn). No entry is due later than `idleWheelHorizon` after it was
    /// entered, which is shorter than any idle timeout: so the entry a new connection
    /// finds in its slot comes due no later than that connection's own deadline.
    static let idleWheelHorizon = KeepAlivePolicy.idleTimeout(forInterval: ProtocolLimits.minimumKeepAliveSeconds)

    /// Enters `slot` in the idle-timeout wheel unless it is there already.
    func enterIdleWheel(_ slot: UInt32) {
        let state = table.state(slot)
        guard !state.pointee.inWheel else { return }
        state.pointee.inWheel = true
        // +1: `lastActivity` is rounded down, so this never closes early.
        let deadline = state.pointee.lastActivity &+ 1 &+ state.pointee.idleTimeout
        wheel.schedule(UInt64(slot), at: min(deadline, nowSeconds &+ Self.idleWheelHorizon))
    }

    private func visitIdleDeadline(_ key: UInt64) {
        let slot = UInt32(truncatingIfNeeded: key)
        let state = table.state(slot)
        state.pointee.inWheel = false
        guard state.pointee.phase == .established else { return }  // its next connection enters it again
        // +1: `lastActivity` is rounded down, so this never closes early.
        let deadline = state.pointee.lastActivity &+ 1 &+ state.pointee.idleTimeout
        if deadline <= nowSeconds {
            context.counters.idleTimeouts.increment()
            closeConnection(slot, with: Close(
                code: .idleTimeout, retryAfterMs: 0, retryJitterMs: 1_000,
                message: "nothing received for \(state.pointee.idleTimeout) s"))
        } else {
            enterIdleWheel(slot)
        }
    }

    /// Shutdown: stop accepting, tell every client when to come back, and exit once they
    /// have all gone (or the drain timeout passes).
    func beginDrain() {
        guard drainDeadline == nil else { return }
        let configuration = context.configuration
        // +1: `nowSeconds` is rounded down, so the drain never ends early.
        drainDeadline = nowSeconds + 1 + configuration.drainTimeout.wholeSecondsRoundedUp
        // Connections the kernel has completed but this loop has not accepted yet would be
        // reset when the listener closes, with no CLOSE: take them in first, so that they
        // get theirs too.
        if listenFD >= 0 { acceptConnections(tls: false) }
        if tlsListenFD >= 0 { acceptConnections(tls: true) }
        stopListening()
        let frame = drainClose
        for slot in table.liveSlots() {
            closeConnection(slot, with: frame)
        }
        if table.liveCount == 0 { vs_event_base_loopbreak(base) }
    }

    /// The CLOSE every device gets when the server drains.
    var drainClose: Close {
        let configuration = context.configuration
        return Close(
            code: .goingAway,
            retryAfterMs: UInt32(clamping: configuration.drainRetryAfter.milliseconds),
            retryJitterMs: UInt32(clamping: configuration.drainJitter.milliseconds),
            message: "server shutting down; reconnect after the advised delay")
    }
}
