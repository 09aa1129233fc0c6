import Foundation
import SignalingProtocol
import SignalingSupport

/// Connecting, adopting a connection, and deciding what to do when one is lost.
extension ClientCore {
    /// What a caller of the blocking `connect` does next (decided on `queue`).
    enum ConnectStep {
        case alreadyConnected(SessionInfo)
        /// An attempt was already running: wait for its owner to settle it.
        case join(ConnectAttempt)
        /// A new attempt was started: the caller owns it (waits, marks, hands it over).
        case own(ConnectAttempt)
        case failed(ConnectError)
    }

    /// How long the owner of a timed-out attempt waits for its thread to notice the
    /// cancellation and clean up. The thread polls a wake-up descriptor, so this is
    /// normally microseconds; only a blocking name resolution can take longer.
    static let cancellationGrace: TimeInterval = 2

    /// On `queue`: the app called `connect(timeout:)`.
    func beginExplicitConnect(timeout: Duration) -> ConnectStep {
        guard !isShutDown else { return .failed(.clientShutDown) }
        wantsConnection = true
        startNetworkMonitorIfNeeded()
        keepAlive.start(now: clock.now())
        switch lifecycle {
        case .connected(_, let info):
            return .alreadyConnected(info)
        case .connecting(let attempt):
            return .join(attempt)
        case .idle, .waiting, .stopped:
            do {
                return .own(try makeAttempt(timeout: timeout))
            } catch {
                enterDisconnected(reason: .connectFailed(error), close: nil, immediate: false)
                return .failed(error)
            }
        }
    }

    /// On `queue`: the back-off ran out, a wake came, or the network changed.
    func startAutomaticConnect() {
        guard wantsConnection, !isShutDown else { return }
        switch lifecycle {
        case .connecting, .connected, .stopped: return
        case .idle, .waiting: break
        }
        let attempt: ConnectAttempt
        do {
            attempt = try makeAttempt(timeout: configuration.connectTimeout)
        } catch {
            enterDisconnected(reason: .connectFailed(error), close: nil, immediate: false)
            return
        }
        let deadline = Date(timeIntervalSinceNow: configuration.connectTimeout.seconds)
        connectQueue.async { [self] in
            _ = try? completeOwnedAttempt(attempt, deadline: deadline)
        }
    }

    /// On `queue`: builds the HELLO from the current session and starts the thread.
    private func makeAttempt(timeout: Duration) throws(ConnectError) -> ConnectAttempt {
        nextAttemptID += 1
        let resume = sessionID.map { ResumePoint(sessionID: $0, lastReceivedSeq: sequencer.resumeSequence) }
        let hello = Hello(
            userID: configuration.userID, deviceID: configuration.deviceID, credentials: credentials,
            resume: resume, requestedKeepAliveSeconds: configuration.requestedKeepAliveSeconds)
        let provider = configuration.credentialsProvider
        let plan = HandshakePlan(
            servers: configuration.servers, preferredServer: preferredServer, resolver: configuration.resolver,
            hello: hello, maxFrameLength: 1 << 20,
            credentialsProvider: provider, credentialsRefusal: provider == nil ? nil : credentialsRefusal,
            tls: tls, tlsSessions: tlsSessions, logger: logger)
        let attempt = try ConnectAttempt(id: nextAttemptID, plan: plan, timeout: timeout)
        lifecycle = .connecting(attempt)
        lastAttempt = attempt
        logger.debug("connect_attempt", ["attempt": nextAttemptID, "first_server": configuration.servers[preferredServer],
                                         "resume": resume != nil, "tls_resume": tlsSessions[preferredServer] != nil])
        emitConnectionState()
        attempt.start()
        return attempt
    }

    /// On the owner's thread (never `queue`): waits for the attempt with the NSConditionLock,
    /// marks the socket on this thread, and hands the connection to the client.
    func completeOwnedAttempt(_ attempt: ConnectAttempt, deadline: Date) throws(ConnectError) -> SessionInfo {
        var outcome: ConnectAttempt.Outcome
        var lockHeld = true
        if attempt.waitUntilFinished(before: deadline) {
            outcome = attempt.claim()
        } else {
            attempt.cancel()
            if attempt.waitUntilFinished(before: Date(timeIntervalSinceNow: Self.cancellationGrace)) {
                outcome = attempt.claim()
                // Finished in the instant between the deadline and the cancellation: the
                // connection is complete and worth keeping.
                if case .failed(.cancelled) = outcome { outcome = .failed(.timedOut) }
            } else {
                // Still resolving a name: the thread cleans up after itself when it returns.
                outcome = .failed(.timedOut)
                lockHeld = false
            }
        }
        let result: Result<SessionInfo, ConnectError>
        switch outcome {
        case .connected(let handshaken):
            let failures = VoIPSocketMarker.mark(
                handshaken.stream.socket, options: configuration.socketOptions,
                idleTimeoutSeconds: handshaken.welcome.idleTimeoutSeconds)
            do {
                let connection = try Connection(id: attempt.id, handshaken: handshaken)
                let welcome = handshaken.welcome
                let info = SessionInfo(
                    sessionID: welcome.sessionID, resumed: welcome.resumed,
                    keepAliveInterval: .seconds(Int64(welcome.keepAliveSeconds)),
                    idleTimeout: .seconds(Int64(welcome.idleTimeoutSeconds)), serverTime: welcome.serverTime,
                    maxFrameLength: Int(welcome.maxFrameLength), localAddress: handshaken.localAddress,
                    remoteAddress: handshaken.remoteAddress, markingFailures: failures, tls: handshaken.stream.tlsDetails,
                    server: configuration.servers[handshaken.server])
                queue.async { [self] in
                    adopt(connection, info: info, handshaken: handshaken, attempt: attempt)
                }
                result = .success(info)
            } catch {
                handshaken.stream.close()
                result = .failure(error)
            }
        case .failed(let error):
            result = .failure(error)
        }
        if case .failure(let error) = result {
            queue.async { [self] in attemptFailed(attempt, error: error) }
        }
        if lockHeld { attempt.settle(result) }
        return try result.get()
    }

    /// On `queue`: installs a marked connection and starts its I/O thread.
    private func adopt(_ connection: Connection, info: SessionInfo, handshaken: HandshakenSocket, attempt: ConnectAttempt) {
        guard case .connecting(let current) = lifecycle, current === attempt, wantsConnection, !isShutDown else {
            // Disconnected or shut down while the caller was marking: drop it.
            handshaken.stream.close()
            return
        }
        let now = clock.now()
        if everConnected { reconnectCount += 1 }
        everConnected = true
        consecutiveFailures = 0
        let resumedFrom = handshaken.resumeRefused ? nil : attempt.plan.hello.resume?.lastReceivedSeq
        sequencer.connectionStarted(welcome: handshaken.welcome, resumedFrom: resumedFrom)
        sessionID = handshaken.welcome.sessionID
        credentials = handshaken.credentials
        credentialsRefusal = nil
        if let session = handshaken.tlsSession { tlsSessions[handshaken.server] = session }
        preferredServer = handshaken.server
        serverMaxFrame = info.maxFrameLength
        connectedAt = now
        lifecycle = .connected(connection, info)
        keepAlive.connected(serverInterval: handshaken.welcome.keepAliveSeconds, now: now)
        logger.info("connected", ["server": configuration.servers[handshaken.server], "local": info.localAddress, "remote": info.remoteAddress,
                                  "session": info.sessionID, "resumed": info.resumed,
                                  "tls": info.tls.map { "\($0.version.rawValue)\($0.resumed ? " resumed" : "")" } ?? "off"])
        emit(.connectionStateChanged(.connected(info)))
        let id = connection.id
        connection.start(leftover: handshaken.leftover) { [weak self] input in
            guard let self else { return }
            self.queue.async { self.handle(input, from: id) }
        }
        sessionStarted(welcome: handshaken.welcome)
        flushOutbox()
        flushAcknowledgement()
        rearmTimer()
    }

    /// On `queue`: an attempt failed (or timed out).
    private func attemptFailed(_ attempt: ConnectAttempt, error: ConnectError) {
        guard case .connecting(let current) = lifecycle, current === attempt else { return }
        consecutiveFailures += 1
        logger.info("connect_failed", ["attempt": attempt.id, "error": error])
        if case .rejected(let close) = error {
            enterDisconnected(reason: .connectFailed(error), close: close, immediate: false)
        } else if case .credentialsUnavailable(let close) = error {
            // The provider had nothing yet: ask it first next time, after a back-off.
            credentialsRefusal = close
            enterDisconnected(reason: .connectFailed(error), close: nil, immediate: false)
        } else if error.isCertificateFailure {
            // It fails the same way until the certificate is fixed or the device leaves
            // the network that intercepts its TLS: wait long, never in a tight loop. The
            // server did not resume the session offered (a rejection comes from a full
            // handshake), so it is of no use any more.
            tlsSessions = [:]
            enterDisconnected(reason: .connectFailed(error), close: nil, immediate: false,
                              delay: backoff.certificateFailureDelay(using: &random))
        } else {
            enterDisconnected(reason: .connectFailed(error), close: nil, immediate: false)
        }
    }

    /// On `queue`: forgets the live connection (its I/O thread was told to close).
    func tearDownConnection() {
        guard case .connected = lifecycle else { return }
        let now = clock.now()
        if let connectedAt, now - connectedAt >= configuration.reconnect.stableConnection { backoff.reset() }
        connectedAt = nil
        keepAlive.disconnected(now: now)
        for completion in outbox.connectionLost() {
            eventQueue.async { completion(.failure(.connectionLost)) }
        }
        lifecycle = .idle
    }

    /// On `queue`: decides the next attempt after a loss or a failure. A CLOSE's advice
    /// wins; otherwise back-off with full jitter, or at once when `immediate`.
    /// `delay`, when given, is used as it is (a rejected certificate's long wait).
    func enterDisconnected(reason: DisconnectReason, close: Close?, immediate: Bool, delay fixedDelay: Duration? = nil) {
        let now = clock.now()
        var delay: Duration
        if let fixedDelay {
            delay = fixedDelay
        } else if let close {
            switch close.action {
            case .stop:
                stopByServer(close)
                return
            case .fresh:
                sessionID = nil
            case .resume:
                break
            case .refreshCredentials:
                credentialsRefusal = close
            }
            delay = ReconnectBackoff.advisedDelay(for: close, using: &random)
            if close.action == .refreshCredentials {
                // A provider that keeps handing out refused tokens must not make this a
                // loop at the server's short delay: back off as after a failure.
                delay = max(delay, backoff.nextDelay(using: &random))
            }
        } else if immediate {
            delay = .zero
        } else {
            delay = backoff.nextDelay(using: &random)
        }
        guard wantsConnection, !isShutDown else {
            lifecycle = .idle
            emitConnectionState()
            rearmTimer()
            return
        }
        if delay < .zero { delay = .zero }
        lifecycle = .waiting(until: now + delay, delay: delay, reason: reason)
        logger.info("reconnect_scheduled", ["delay": delay, "reason": reason])
        emitConnectionState()
        rearmTimer()
    }

    /// CLOSE with action `stop`: never reconnect by ourselves (PROTOCOL 4.1, takeover).
    private func stopByServer(_ close: Close) {
        wantsConnection = false
        if keepAliveHandler == nil { keepAlive.stop() }
        lifecycle = .stopped(.serverRefused(close))
        logger.warning("stopped_by_server", ["code": close.code, "message": close.message])
        emitConnectionState()
        rearmTimer()
    }

    func startNetworkMonitorIfNeeded() {
        guard configuration.watchesNetwork, !networkMonitorStarted, let monitor = networkMonitor else { return }
        networkMonitorStarted = true
        do {
            try monitor.start { [weak self] change in
                guard let self else { return }
                self.queue.async { self.networkChanged(change) }
            }
        } catch {
            logger.warning("network_monitor_unavailable", ["error": error])
        }
    }
}
