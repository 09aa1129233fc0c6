import CLinuxShims
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Connection life: connect, HELLO, WELCOME, disconnects, reconnects, keep-alive.
extension LoadWorker {
    /// The handshake must finish within this, like the client library's deadline.
    static let handshakeTimeoutMilliseconds: UInt32 = 10_000

    var inFlight: Int { status.inFlight }

    func startQueuedConnections(now: UInt64) {
        while connectQueueHead < connectQueue.count && inFlight < setup.maxInFlight {
            if setup.connectRate > 0 {
                let allowed = Int(Double(now &- rampStartedAt) / 1e9 * setup.connectRate) + 1
                guard rampStarted < allowed else { return }
            }
            let slot = connectQueue[connectQueueHead]
            connectQueueHead += 1
            rampStarted += 1
            startAttempt(slot: slot, now: now)
        }
        if connectQueueHead >= connectQueue.count && !connectQueue.isEmpty {
            connectQueue = []
            connectQueueHead = 0
        }
    }

    func startAttempt(slot: Int, now: UInt64) {
        status.connectAttempts += 1
        table.attemptStartedAt[slot] = now
        switch SocketCalls.startConnect(from: layout.sourceAddress(ofSlot: slot), to: server(forSlot: slot)) {
        case .failure(let error):
            // EMFILE, EADDRNOTAVAIL (ports exhausted) and the like: retry later.
            table.state[slot] = .connecting
            status.inFlight += 1
            connectionLost(slot: slot, reason: error.description, now: now)
        case .success(let (fd, connected)):
            table.fd[slot] = fd
            table.state[slot] = .connecting
            status.inFlight += 1
            setTimer(slot, milliseconds(now) &+ Self.handshakeTimeoutMilliseconds)
            let added = epoll.add(fd, token: UInt64(slot), events: Epoll.readable | Epoll.writable)
            if added != 0 {
                connectionLost(slot: slot, reason: SystemError("epoll_ctl", added).description, now: now)
            } else if connected {
                transportConnected(slot: slot, now: now)
            }
        }
    }

    func handleReadiness(slot: Int, events: UInt32) {
        guard slot < table.count, table.fd[slot] >= 0 else { return }
        let now = clock.now().nanoseconds
        if table.state[slot] == .connecting {
            guard events & (Epoll.output | Epoll.error | Epoll.hangUp) != 0 else { return }
            let error = SocketCalls.pendingError(table.fd[slot])
            if error != 0 {
                connectionLost(slot: slot, reason: SystemError("connect", error).description, now: now)
                return
            }
            transportConnected(slot: slot, now: now)
            return
        }
        if table.state[slot] == .securing {
            continueTLSHandshake(slot: slot, now: now)
            return
        }
        // A TLS write may wait for input too (OpenSSL reading a record of its own first).
        if events & Epoll.output != 0 || (table.tls[slot] != nil && unsentBytes[slot] != nil) { flushUnsent(slot: slot, now: now) }
        guard table.fd[slot] >= 0 else { return }
        if events & (Epoll.input | Epoll.peerClosed | Epoll.hangUp | Epoll.error) != 0 {
            readSocket(slot: slot)
        }
    }

    func sendHello(slot: Int) {
        let identity = layout.identity(ofSlot: slot)
        let credentials = deviceCredentials.credentials(
            user: identity.user, device: identity.device, now: Int64(SystemClock().wallMilliseconds() / 1000))
        let resume = table.hasSession[slot]
            ? ResumePoint(sessionID: table.session[slot], lastReceivedSeq: table.lastSeq[slot]) : nil
        let hello = Hello(
            userID: identity.user, deviceID: identity.device, credentials: credentials, resume: resume,
            requestedKeepAliveSeconds: setup.requestedKeepAlive)
        table.state[slot] = .handshaking
        epoll.modify(table.fd[slot], token: UInt64(slot), events: Epoll.readable)
        send(FrameEncoder.encode(.hello(hello)), slot: slot)
    }

    func welcomed(_ welcome: Welcome, slot: Int, receivedAt now: UInt64) {
        guard table.state[slot] == .handshaking else {
            protocolFailure(slot: slot, "WELCOME on an established connection", now: now)
            return
        }
        if !welcome.resumed && welcome.ackedSeq == 0 && table.lastSeq[slot] > 0 {
            // A fresh session whose server knows nothing of this device: a restarted
            // server without persistence. Its numbering starts again at 1.
            table.lastSeq[slot] = 0
            status.sequenceResets += 1
        }
        table.session[slot] = welcome.sessionID
        table.hasSession[slot] = true
        // TLS 1.3 sends the ticket right after the handshake, before WELCOME: keep it for
        // the next connection of this device.
        if let session = table.tls[slot]?.resumableSession() { table.tlsSession[slot] = session }
        table.state[slot] = .established
        table.attempts[slot] = 0
        status.inFlight -= 1
        status.handshakes += 1
        if welcome.resumed { status.resumed += 1 }
        if case .idleDevice = layout.role(ofSlot: slot) { status.idleHandshakes += 1 }
        handshakeLatency.record(nanoseconds: now &- table.attemptStartedAt[slot])
        // Not stored per slot: every device of a run asks for the same interval, so the
        // server grants them all the same one.
        grantedKeepAlive = max(welcome.keepAliveSeconds, ProtocolLimits.minimumKeepAliveSeconds)
        setTimer(slot, milliseconds(now) &+ grantedKeepAlive &* 1000)
        adjustConnected(slot: slot, by: 1)
    }

    /// The server said goodbye: follow its advice (docs/PROTOCOL.md 4.4).
    func closed(by close: Close, slot: Int, now: UInt64) {
        let reason = "CLOSE \(close.code)"
        switch close.action {
        case .stop:
            disconnect(slot: slot, reason: reason)
            fail(slot: slot, reason: reason)
        case .resume, .fresh, .refreshCredentials:
            // A refused token is minted again at the next HELLO (with a new expiry).
            if close.action == .fresh { table.hasSession[slot] = false }
            let jitter = close.retryJitterMs == 0 ? 0 : UInt32(random.next() % (UInt64(close.retryJitterMs) + 1))
            disconnect(slot: slot, reason: reason)
            scheduleRetry(slot: slot, at: milliseconds(now) &+ close.retryAfterMs &+ jitter, now: now)
        }
    }

    /// A connection ended without a CLOSE (refused, reset, timed out): back off and retry.
    func connectionLost(slot: Int, reason: String, now: UInt64) {
        disconnect(slot: slot, reason: reason)
        table.attempts[slot] &+= table.attempts[slot] == .max ? 0 : 1
        let delay = Backoff.delay(attempt: table.attempts[slot], random: random.next())
        scheduleRetry(slot: slot, at: milliseconds(now) &+ delay, now: now)
    }

    func scheduleRetry(slot: Int, at due: UInt32, now: UInt64) {
        if due > table.giveUpAt[slot] {
            fail(slot: slot, reason: "no connection within \(Int(setup.connectTimeoutSeconds)) s")
            return
        }
        table.state[slot] = .waiting
        setTimer(slot, due)
    }

    /// Closes the socket and forgets the connection's buffers; the slot's state is then
    /// set by the caller.
    func disconnect(slot: Int, reason: String) {
        status.disconnects[reason, default: 0] += 1
        switch table.state[slot] {
        case .connecting, .securing, .handshaking:
            status.inFlight -= 1
        case .established:
            adjustConnected(slot: slot, by: -1)
            // A new episode of disconnection: the device has its full timeout again.
            table.giveUpAt[slot] = millisecondsNow() &+ UInt32(setup.connectTimeoutSeconds * 1000)
        default:
            break
        }
        releaseTLS(slot: slot)
        if table.fd[slot] >= 0 {
            close(table.fd[slot])
            table.fd[slot] = -1
        }
        table.state[slot] = .waiting
        partialFrames[slot] = nil
        unsentBytes[slot] = nil
    }

    func fail(slot: Int, reason: String) {
        table.state[slot] = .failed
        status.failures[reason, default: 0] += 1
        if case .idleDevice = layout.role(ofSlot: slot) { status.idleFailed += 1 }
    }

    func protocolFailure(slot: Int, _ reason: String, now: UInt64) {
        disconnect(slot: slot, reason: "protocol error")
        fail(slot: slot, reason: "protocol error: \(reason)")
    }

    func adjustConnected(slot: Int, by delta: Int) {
        switch layout.role(ofSlot: slot) {
        case .idleDevice: status.idleConnected += delta
        case .probeSender, .fanoutSender: status.sendersConnected += delta
        case .fanoutDevice: status.fanoutConnected += delta
        }
    }

    func setTimer(_ slot: Int, _ due: UInt32) {
        table.timer[slot] = due
        if due < nextTimerDue { nextTimerDue = due }
    }

    /// Fires due timers: reconnects, handshake deadlines and keep-alive PINGs. Scans
    /// the table only when the earliest timer is due, so holding idle sockets costs
    /// nothing between keep-alives.
    func runDueTimers(now: UInt64) {
        let nowMs = milliseconds(now)
        guard nextTimerDue <= nowMs else { return }
        var earliest = UInt32.max
        for slot in 0..<table.count {
            let state = table.state[slot]
            guard state != .unstarted && state != .failed else { continue }
            var due = table.timer[slot]
            if due <= nowMs {
                switch state {
                case .waiting:
                    if inFlight < setup.maxInFlight {
                        startAttempt(slot: slot, now: now)
                    } else {
                        table.timer[slot] = nowMs &+ 1  // retry when an attempt finishes
                    }
                case .connecting, .securing, .handshaking:
                    connectionLost(slot: slot, reason: "handshake timeout", now: now)
                case .established:
                    send(FrameEncoder.encode(.ping), slot: slot)
                    if table.state[slot] == .established { table.timer[slot] = nowMs &+ grantedKeepAlive &* 1000 }
                case .unstarted, .failed:
                    break
                }
                due = table.timer[slot]
                if table.state[slot] == .failed { continue }
            }
            earliest = min(earliest, due)
        }
        nextTimerDue = earliest
    }

    /// Storm: every idle device loses its connection at the same moment and comes back at
    /// once with its resume point, as after a carrier NAT reboot.
    func dropIdleConnections(now: UInt64) {
        let nowMs = milliseconds(now)
        let deadline = nowMs &+ UInt32(setup.connectTimeoutSeconds * 1000)
        for slot in layout.idleSlots where table.state[slot] != .failed && table.state[slot] != .unstarted {
            disconnect(slot: slot, reason: "dropped by storm")
            table.attempts[slot] = 0
            table.giveUpAt[slot] = deadline
            setTimer(slot, nowMs)
        }
    }
}
