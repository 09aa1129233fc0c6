import SignalingProtocol
import SignalingSupport

/// The background model: application state, wakes, background tasks, the keep-alive
/// handler, local notifications and network changes.
extension ClientCore {
    // MARK: Application state

    func enterBackground() {
        perform(background.enterBackground(now: clock.now()))
        rearmTimer()
    }

    /// Returning to the foreground ends running background tasks, and a client waiting to
    /// reconnect tries at once (the user is looking).
    func enterForeground() {
        #if canImport(UIKit) && os(iOS)
        background.runningTasks.forEach(ApplePlatformBridge.taskEnded)
        #endif
        let actions = background.enterForeground(now: clock.now())
        expirationHandlers.removeAll()
        perform(actions)
        if case .waiting = lifecycle { startAutomaticConnect() }
        flushOutbox()
        rearmTimer()
    }

    /// Carries out what the background state machine decided.
    func perform(_ actions: [BackgroundExecution.Action]) {
        for action in actions {
            switch action {
            case .stateChanged(let state):
                logger.debug("application_state", ["state": state])
                emit(.applicationStateChanged(state))
            case .woken(let reason):
                logger.debug("woken", ["reason": reason])
                emit(.woken(reason))
            case .runExpirationHandler(let identifier):
                if let handler = expirationHandlers[identifier] { eventQueue.async(execute: handler) }
            case .taskExpired(let identifier, let name):
                expirationHandlers[identifier] = nil
                #if canImport(UIKit) && os(iOS)
                ApplePlatformBridge.taskEnded(identifier)
                #endif
                logger.error("background_task_expired", ["task": name])
                emit(.backgroundTaskExpired(identifier, name: name))
            }
        }
    }

    // MARK: Background tasks

    func beginBackgroundTask(name: String, expirationHandler: (@Sendable () -> Void)?) -> BackgroundTaskIdentifier {
        let identifier = background.beginTask(name: name, now: clock.now())
        if identifier != .invalid, let expirationHandler { expirationHandlers[identifier] = expirationHandler }
        #if canImport(UIKit) && os(iOS)
        if identifier != .invalid { ApplePlatformBridge.taskBegan(identifier, name: name) }
        #endif
        rearmTimer()
        return identifier
    }

    func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        expirationHandlers[identifier] = nil
        #if canImport(UIKit) && os(iOS)
        ApplePlatformBridge.taskEnded(identifier)
        #endif
        perform(background.endTask(identifier, now: clock.now()))
        rearmTimer()
    }

    // MARK: Keep-alive

    /// iOS semantics: under 600 s (or not finite) is refused and nothing changes.
    func setKeepAliveTimeout(_ seconds: Double, handler: @escaping @Sendable () -> Void) -> Bool {
        guard seconds.isFinite, seconds >= KeepAliveSchedule.minimumInterval.seconds, seconds <= 1e9 else { return false }
        keepAliveHandler = handler
        keepAlive.setAppInterval(.milliseconds(Int64(seconds * 1000)), now: clock.now())
        #if canImport(UIKit) && os(iOS)
        ApplePlatformBridge.installKeepAlive(interval: keepAlive.interval.seconds) { [weak self] in
            guard let self else { return }
            self.queue.async { self.systemKeepAliveFired() }
        }
        #endif
        rearmTimer()
        return true
    }

    /// The platform's own keep-alive timer fired (iOS: the `setKeepAliveTimeout` handler,
    /// which may come earlier than the interval, never later): run the keep-alive now.
    func systemKeepAliveFired() {
        let now = clock.now()
        keepAlive.runNow(now: now)
        runKeepAliveHandler(now: now)
        rearmTimer()
    }

    /// A PING on demand (`SignalingClient.pingNow`): the keep-alive's next run stays where
    /// it is; the PONG deadline applies as usual.
    func pingNow() -> Bool {
        guard let connection = currentConnection, keepAlive.canPing else { return false }
        connection.send(FrameEncoder.encode(.ping))
        keepAlive.pingSent(now: clock.now())
        rearmTimer()
        return true
    }

    func clearKeepAliveTimeout() {
        keepAliveHandler = nil
        #if canImport(UIKit) && os(iOS)
        ApplePlatformBridge.clearKeepAlive()
        #endif
        keepAlive.setAppInterval(nil, now: clock.now())
        if !wantsConnection { keepAlive.stop() }
        rearmTimer()
    }

    func perform(_ action: KeepAliveSchedule.Action, now: Instant) {
        switch action {
        case .runHandler:
            runKeepAliveHandler(now: now)
        case .pongOverdue:
            guard let connection = currentConnection else { return }
            logger.warning("pong_overdue")
            connection.abort()
            tearDownConnection()
            enterDisconnected(reason: .keepAliveTimedOut, close: nil, immediate: true)
        case .handlerExpired:
            logger.warning("keepalive_handler_expired")
            emit(.keepAliveHandlerExpired)
        }
    }

    /// The keep-alive wake. The library's own part (the default handler) always runs:
    /// PING on a live connection, or reconnect at once when there is none. The app's
    /// handler, if installed, runs after it on the app's queue within its budget.
    func runKeepAliveHandler(now: Instant) {
        perform(background.wake(.keepAliveTimer, now: now))
        switch lifecycle {
        case .connected(let connection, _):
            if keepAlive.canPing {
                connection.send(FrameEncoder.encode(.ping))
                keepAlive.pingSent(now: now)
            }
        case .waiting, .idle:
            startAutomaticConnect()
        case .connecting, .stopped:
            break
        }
        keepAliveRun += 1
        let run = keepAliveRun
        guard let handler = keepAliveHandler else {
            keepAlive.handlerFinished()
            return
        }
        eventQueue.async { [weak self] in
            handler()
            guard let self else { return }
            self.queue.async {
                if run == self.keepAliveRun { self.keepAlive.handlerFinished() }
                self.rearmTimer()
            }
        }
    }

    // MARK: Local notifications

    @discardableResult
    func post(_ notification: LocalNotification) -> NotificationPostResult {
        let result = notifications.post(notification)
        switch result {
        case .posted, .replaced:
            emit(.notificationPosted(notification, removed: nil))
        case .postedRemovingOldest(let oldest):
            logger.warning("notification_cap_reached", ["removed": oldest.identifier])
            emit(.notificationPosted(notification, removed: oldest))
        case .rejected:
            break
        }
        SystemNotificationBridge.post(notification, result: result)
        return result
    }

    // MARK: Network changes

    /// On `queue`. A change that does not affect the connection is ignored (no wake, as
    /// iOS wakes only for changes that matter). One that does wakes the app and
    /// reconnects at once with the connect-then-mark flow.
    func networkChanged(_ change: NetworkChange) {
        guard !isShutDown else { return }
        let now = clock.now()
        switch lifecycle {
        case .connected(let connection, _):
            guard let verdict = PathEvaluator.evaluate(local: connection.localAddress, remote: connection.remoteAddress)
            else { return }
            logger.info("network_path_changed", ["change": verdict])
            perform(background.wake(.networkChange, now: now))
            emit(.networkPathChanged(verdict))
            connection.abort()
            tearDownConnection()
            backoff.reset()
            enterDisconnected(reason: .networkChanged(verdict), close: nil, immediate: true)
        case .waiting:
            // Something changed while we were offline: worth an attempt now, but at most
            // one per back-off base step so a chatty netlink cannot drive a connect loop.
            if let last = lastNetworkTriggeredAttempt, now - last < configuration.reconnect.initialDelay { return }
            lastNetworkTriggeredAttempt = now
            perform(background.wake(.networkChange, now: now))
            emit(.networkPathChanged(.networkChangedWhileDisconnected))
            startAutomaticConnect()
        case .idle, .connecting, .stopped:
            return
        }
        rearmTimer()
    }
}
