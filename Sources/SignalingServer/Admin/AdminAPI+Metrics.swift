import SignalingProtocol
import SignalingSupport
import SignalingPush

/// `GET /metrics`: the server's counters in the Prometheus text format. Reading costs one
/// pass over the loops' cells (each counter and histogram summed over the loops) and one
/// short hold of each routing shard (its counters are a copied struct), handed to the
/// shard's owner loop while it runs (`Switchboard.counters`), never a walk over devices or
/// connections.
extension AdminAPI {
    /// Two samples of `name`, `transport="plain"` and `transport="tls"`, from a total and
    /// its TLS part (read apart, so never below 0).
    static func sampleByTransport(_ name: String, all: Int, tls: Int, into out: inout PrometheusText) {
        out.sample(name, ["transport": "plain"], max(0, all - tls))
        out.sample(name, ["transport": "tls"], tls)
    }

    /// What the sockets of a node's device listeners did, the same on a home and a front
    /// (a front's `SignalingServer.frontMetrics`): connections accepted by transport, TLS
    /// handshakes by result and failures by reason, the certificate's expiry.
    static func socketMetrics(_ context: ServerContext, loops: [EventLoop], into out: inout PrometheusText) {
        let counters = context.counters
        let accepted = counters.acceptedConnections.value
        out.family("voipserver_connections_accepted_total", .counter, "Device connections accepted, by transport.")
        sampleByTransport("voipserver_connections_accepted_total", all: accepted, tls: counters.acceptedTLSConnections.value, into: &out)
        out.family("voipserver_tls_handshakes_total", .counter, "TLS handshakes on the device listener by result: full, resumed (a session ticket), failed.")
        out.sample("voipserver_tls_handshakes_total", ["result": "full"], counters.tlsHandshakesFull.value)
        out.sample("voipserver_tls_handshakes_total", ["result": "resumed"], counters.tlsHandshakesResumed.value)
        out.sample("voipserver_tls_handshakes_total", ["result": "failed"], counters.tlsHandshakesFailed.value)
        out.family("voipserver_tls_handshake_failures_total", .counter, "Failed TLS handshakes by reason: not_tls, version, alpn, cipher, certificate (the client refused ours), socket, closed, timeout, other.")
        for reason in TLSHandshakeFailure.allCases {
            out.sample("voipserver_tls_handshake_failures_total", ["reason": reason.rawValue], loops.reduce(0) { $0 + $1.metrics.tlsHandshakesFailed(reason) })
        }
        if let expiry = context.tlsContext?.certificateNotAfter {
            out.family("voipserver_tls_certificate_expiry_timestamp_seconds", .gauge, "When the certificate new TLS connections get expires (Unix time): alert well before it.")
            out.sample("voipserver_tls_certificate_expiry_timestamp_seconds", [:], expiry)
        }
    }

    func metrics() -> String {
        let counters = context.counters
        let routing = context.switchboard.counters
        let open = counters.openConnections.value
        let established = counters.establishedConnections.value
        var out = PrometheusText()

        out.family("voipserver_build_info", .gauge, "Always 1; the labels say which build runs.")
        out.sample("voipserver_build_info", ["version": ProductVersion.current, "protocol": String(ProtocolLimits.version)], 1)
        let state = readiness()
        out.family("voipserver_ready", .gauge, "1 when /readyz answers 200: listening, not draining, store healthy.")
        out.sample("voipserver_ready", [:], state.isReady ? 1 : 0)
        out.family("voipserver_draining", .gauge, "1 once shutdown has begun.")
        out.sample("voipserver_draining", [:], state.draining ? 1 : 0)
        Self.role("active", into: &out)
        out.family("voipserver_thread_cpus", .gauge, "Always 1: the CPUs each event loop and store thread was given at start (cpus=\"any\": where the scheduler puts it), and how the placement was decided (--thread-placement, --loop-cpus).")
        for (thread, cpus) in threadPlacement.threads {
            out.sample("voipserver_thread_cpus", ["thread": thread, "cpus": cpus, "placement": threadPlacement.source.rawValue], 1)
        }

        let openTLS = counters.openTLSConnections.value
        let establishedTLS = counters.establishedTLSConnections.value
        out.family("voipserver_connections", .gauge, "Open device connections by state (handshake includes closing ones) and transport (plain TCP or TLS).")
        out.sample("voipserver_connections", ["state": "handshake", "transport": "plain"], max(0, (open - openTLS) - (established - establishedTLS)))
        out.sample("voipserver_connections", ["state": "established", "transport": "plain"], max(0, established - establishedTLS))
        out.sample("voipserver_connections", ["state": "handshake", "transport": "tls"], max(0, openTLS - establishedTLS))
        out.sample("voipserver_connections", ["state": "established", "transport": "tls"], establishedTLS)
        Self.socketMetrics(context, loops: loops, into: &out)
        out.family("voipserver_connections_moved_total", .counter, "Connections a loop accepted and handed over, once their HELLO was verified, to their user's home loop (the loop that owns the user's routing shard), by the loop that accepted them.")
        for (index, loop) in loops.enumerated() {
            out.sample("voipserver_connections_moved_total", ["loop": String(index)], loop.metrics.connectionsMoved.value)
        }
        out.family("voipserver_relayed_connections", .gauge, "Relayed connections open here as a cluster's routing node: devices whose sockets a front node holds (of the connections above), by how the device reached its front: plain TCP or TLS.")
        Self.sampleByTransport(
            "voipserver_relayed_connections", all: counters.relayedConnections.value, tls: counters.relayedTLSConnections.value, into: &out)
        out.family("voipserver_relay_frames_total", .counter, "Relay frames (open, data, closed, finish, release, reset) exchanged with front nodes, by direction.")
        out.sample("voipserver_relay_frames_total", ["direction": "received"], counters.relayFramesReceived.value)
        out.sample("voipserver_relay_frames_total", ["direction": "sent"], counters.relayFramesSent.value)
        out.family("voipserver_connections_refused_total", .counter, "Connections refused before any handshake, by reason.")
        out.sample("voipserver_connections_refused_total", ["reason": "per_address_limit"], counters.connectionsRefusedPerAddress.value)
        out.family("voipserver_connections_uncounted_total", .counter, "Connections admitted without being counted against their address's cap: the per-address table had no room for the address.")
        out.sample("voipserver_connections_uncounted_total", [:], counters.connectionsUncountedPerAddress.value)
        out.family("voipserver_connection_closes_total", .counter, "Connections the server closed, by reason (takeovers: another connection of the device).")
        out.sample("voipserver_connection_closes_total", ["reason": "idle_timeout"], counters.idleTimeouts.value)
        out.sample("voipserver_connection_closes_total", ["reason": "protocol_error"], counters.protocolErrors.value)
        out.sample("voipserver_connection_closes_total", ["reason": "slow_consumer"], counters.slowConsumerCloses.value)
        out.sample("voipserver_connection_closes_total", ["reason": "takeover"], counters.takeovers.value)

        out.family("voipserver_handshakes_total", .counter, "Handshakes by result: completed, throttled (CLOSE overloaded), timeout, or the CLOSE code that refused the HELLO.")
        out.sample("voipserver_handshakes_total", ["result": "completed"], counters.handshakesCompleted.value)
        out.sample("voipserver_handshakes_total", ["result": "throttled"], counters.handshakesThrottled.value)
        out.sample("voipserver_handshakes_total", ["result": "timeout"], counters.handshakeTimeouts.value)
        for code in CloseCode.allCases {
            let refused = loops.reduce(0) { $0 + $1.metrics.handshakesRefused(code) }
            if refused > 0 { out.sample("voipserver_handshakes_total", ["result": String(describing: code)], refused) }
        }

        let requestTypes: [FrameType] = [.callInvite, .callRinging, .callAccept, .callReject, .callCancel, .callHangup, .messageSend, .pushRegister]
        out.family("voipserver_requests_total", .counter, "Requests received from devices (events in), by kind.")
        for type in requestTypes {
            out.sample("voipserver_requests_total", ["kind": String(describing: type)], loops.reduce(0) { $0 + $1.metrics.requestsReceived(type) })
        }
        let eventTypes: [FrameType] = [.callIncoming, .callRang, .callAccepted, .callEnded, .message, .messageDelivered]
        out.family("voipserver_events_written_total", .counter, "Events written to device sockets (events out, re-sends included), by kind.")
        for type in eventTypes {
            out.sample("voipserver_events_written_total", ["kind": String(describing: type)], loops.reduce(0) { $0 + $1.metrics.eventsWritten(type) })
        }
        out.family("voipserver_events_queued_total", .counter, "Events queued for devices.")
        out.sample("voipserver_events_queued_total", [:], routing.eventsQueued)
        out.family("voipserver_pending_events", .gauge, "Events waiting for an acknowledgement, in device queues or held for users with no device.")
        out.sample("voipserver_pending_events", [:], routing.pendingEvents)
        out.family("voipserver_pending_event_bytes", .gauge, "Bytes held by undelivered events (what --memory-budget limits).")
        out.sample("voipserver_pending_event_bytes", [:], context.switchboard.eventBytes)
        out.family("voipserver_event_bodies_total", .counter, "Message bodies dropped from memory (the store keeps them) and read back from the store.")
        out.sample("voipserver_event_bodies_total", ["direction": "evicted"], routing.bodiesEvicted)
        out.sample("voipserver_event_bodies_total", ["direction": "restored"], routing.bodiesRestored)
        out.histogram(
            "voipserver_push_latency_seconds", "Server-side push latency: event created to written to its socket (connected devices).",
            loops.map { $0.metrics.pushLatency.snapshot() }.reduce(LatencyHistogram().snapshot(), +))

        let holds = context.switchboard.lockHolds(of: loops)
        out.histogram(
            "voipserver_routing_lock_hold_seconds",
            "How long each hold of a routing shard lasted: by its owner loop, which takes no lock; by other threads under the shard's fallback lock when no loop runs it (every loop and other thread; 64 ns to 16.8 ms in powers of two).",
            holds)
        out.family("voipserver_routing_lock_hold_max_seconds", .gauge, "The longest hold of a routing shard since start.")
        out.sample("voipserver_routing_lock_hold_max_seconds", [:], Double(holds.maxNanoseconds) / 1e9)
        out.family(
            "voipserver_routing_shard_handoffs_total", .counter,
            "Holds of a routing shard that a thread other than its owner (the admin API, the push gateway, a reload) handed to the owner loop and waited for.")
        out.sample("voipserver_routing_shard_handoffs_total", [:], context.switchboard.handedToOwner.load(ordering: .relaxed))
        // Every lock more than one thread takes on a per-event or per-handshake path. A
        // routing shard's is its fallback lock: taken only while no loop runs the shard.
        let lockHolds = SharedLock.allCases.map { lock in (value: lock.label, snapshot: LockHolds.snapshot(lock, of: loops)) }
        out.histogram(
            "voipserver_lock_hold_seconds",
            "How long each hold of each shared lock lasted, by lock (every loop and other thread; 64 ns to 16.8 ms in powers of two).",
            by: "lock", lockHolds)
        out.family("voipserver_lock_hold_max_seconds", .gauge, "The longest hold of each shared lock since start.")
        for (lock, snapshot) in lockHolds {
            out.sample("voipserver_lock_hold_max_seconds", ["lock": lock], Double(snapshot.maxNanoseconds) / 1e9)
        }
        out.family("voipserver_routing_shards", .gauge, "How many shards the routing state is split into (one per loop).")
        out.sample("voipserver_routing_shards", [:], context.switchboard.shardCount)
        out.family(
            "voipserver_routing_steps_total", .counter,
            "Steps of operations across shards: run by their shard's owner loop, and posted to it by another loop.")
        out.sample("voipserver_routing_steps_total", ["how": "run"], loops.reduce(0) { $0 + $1.metrics.stepsRun.value })
        out.sample("voipserver_routing_steps_total", ["how": "posted"], loops.reduce(0) { $0 + $1.metrics.stepsPosted.value })

        out.family("voipserver_messages_total", .counter, "Messages by outcome.")
        out.sample("voipserver_messages_total", ["result": "accepted"], routing.messagesAccepted)
        out.sample("voipserver_messages_total", ["result": "deduplicated"], routing.messagesDeduplicated)
        out.sample("voipserver_messages_total", ["result": "cancelled"], routing.messagesCancelled)
        out.family("voipserver_calls_started_total", .counter, "Calls started.")
        out.sample("voipserver_calls_started_total", [:], routing.callsStarted)
        out.family("voipserver_refusals_total", .counter, "Messages and calls refused, by reason.")
        out.sample("voipserver_refusals_total", ["reason": "sender_quota"], routing.refusedSenderQuota)
        out.sample("voipserver_refusals_total", ["reason": "rate"], routing.refusedRate)
        out.sample("voipserver_refusals_total", ["reason": "capacity"], routing.refusedCapacity)
        out.family("voipserver_events_dropped_total", .counter, "Events thrown away, by reason: a full queue (call events, receipts) or expiry with their device or hold.")
        out.sample("voipserver_events_dropped_total", ["reason": "queue_full"], routing.eventsDropped)
        out.sample("voipserver_events_dropped_total", ["reason": "expired"], routing.eventsExpired)
        out.family("voipserver_slow_consumers_total", .counter, "Connections closed with CLOSE slowConsumer.")
        out.sample("voipserver_slow_consumers_total", [:], counters.slowConsumerCloses.value)
        out.family("voipserver_sessions_expired_total", .counter, "Sessions no longer resumable after --session-ttl.")
        out.sample("voipserver_sessions_expired_total", [:], routing.sessionsExpired)
        out.family("voipserver_devices_expired_total", .counter, "Devices forgotten after --event-ttl.")
        out.sample("voipserver_devices_expired_total", [:], routing.devicesExpired)

        out.family("voipserver_store_healthy", .gauge, "1 while the store commits (no store: 1).")
        out.sample("voipserver_store_healthy", [:], (writer?.isHealthy ?? true) ? 1 : 0)
        if let writer {
            out.family("voipserver_store_commits_total", .counter, "Store commits (group commits) by result.")
            out.sample("voipserver_store_commits_total", ["result": "ok"], writer.commits.load(ordering: .relaxed))
            out.sample("voipserver_store_commits_total", ["result": "failed"], writer.failedCommits.load(ordering: .relaxed))
            out.histogram("voipserver_store_commit_seconds", "Time one store commit took (committed or failed).", writer.commitLatency.snapshot())
            out.family("voipserver_store_threads_idle_priority", .gauge, "1 while the store writer and the store's own threads run at the idle scheduling policy (--store-thread-priority auto), 0 while at the normal one (raised, at nice 19 or their own nice value).")
            out.sample("voipserver_store_threads_idle_priority", [:], writer.threadsAtIdlePriority.load(ordering: .relaxed) ? 1 : 0)
            out.family("voipserver_store_thread_raises_total", .counter, "Times the store's threads were raised because the writer had kept work waiting: to the normal policy at nice 19 (50 ms), or at their own nice value (250 ms; 20 ms without a pass of the writer: starved).")
            out.sample("voipserver_store_thread_raises_total", ["to": "nice19"], writer.threadPriorityRaises.load(ordering: .relaxed))
            out.sample("voipserver_store_thread_raises_total", ["to": "normal"], writer.threadPriorityRaisesToNormal.load(ordering: .relaxed))
        }
        out.family("voipserver_loops_realtime", .gauge, "1 while the event loops run under SCHED_FIFO (--loop-realtime), 0 while at the normal policy (a ramp of connections, a saturated loop, the hypervisor stealing CPU time, off or not permitted).")
        out.sample("voipserver_loops_realtime", [:], context.loopPriority?.realtimeNow.load(ordering: .relaxed) == true ? 1 : 0)
        if let control = context.loopPriority {
            out.family("voipserver_loops_realtime_changes_total", .counter, "Moves of the event loops to SCHED_FIFO after a calm second, a calm minute after steal (to=\"realtime\"), and back to the normal policy for a ramp of connections, a saturated loop or the hypervisor stealing 1 % or more of the host's CPU time (to=\"normal\").")
            out.sample("voipserver_loops_realtime_changes_total", ["to": "realtime", "reason": "calm"], control.raises.load(ordering: .relaxed))
            out.sample("voipserver_loops_realtime_changes_total", ["to": "normal", "reason": "ramp"], control.loweredForRamp.load(ordering: .relaxed))
            out.sample("voipserver_loops_realtime_changes_total", ["to": "normal", "reason": "saturated"], control.loweredSaturated.load(ordering: .relaxed))
            out.sample("voipserver_loops_realtime_changes_total", ["to": "normal", "reason": "steal"], control.loweredForSteal.load(ordering: .relaxed))
        }
        if let push = pushGateway?.statistics {
            out.family("voipserver_wakeups_total", .counter, "Push wake-ups by outcome (docs/PUSH.md).")
            out.sample("voipserver_wakeups_total", ["result": "sent"], push.sent)
            out.sample("voipserver_wakeups_total", ["result": "rejected"], push.rejected)
            out.sample("voipserver_wakeups_total", ["result": "dropped"], push.dropped)
            out.sample("voipserver_wakeups_total", ["result": "coalesced"], push.coalesced)
            out.family("voipserver_wakeup_attempts_failed_total", .counter, "Wake-up attempts that failed (each may be retried).")
            out.sample("voipserver_wakeup_attempts_failed_total", [:], push.failedAttempts)
            out.family("voipserver_wakeups_in_flight", .gauge, "Wake-up requests on the wire.")
            out.sample("voipserver_wakeups_in_flight", [:], push.inFlight)
            out.family("voipserver_push_tokens_removed_total", .counter, "Push tokens APNs or FCM declared invalid, removed from their device.")
            out.sample("voipserver_push_tokens_removed_total", [:], push.tokensRemoved)
            out.family("voipserver_push_rejections_total", .counter, "Wake-ups refused by the push service, by service:reason (at most 64 reasons).")
            for (reason, count) in push.rejectionReasons.sorted(by: { $0.key < $1.key }) {
                out.sample("voipserver_push_rejections_total", ["reason": reason], count)
            }
        }
        return out.text
    }
}

extension AdminAPI {
    /// `voipserver_role`: active (serving devices) or standby (waiting for the store
    /// lease, docs/CLUSTER.md). A node without a lease is always active.
    static func role(_ role: String, into out: inout PrometheusText) {
        out.family("voipserver_role", .gauge, "1 for the node's role: active (serves devices) or standby (waits for the store lease).")
        out.sample("voipserver_role", ["role": role], 1)
    }
}
