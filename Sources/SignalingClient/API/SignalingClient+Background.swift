import SignalingSupport

/// The background model (docs/CLIENT.md, "Background execution model").
extension SignalingClient {
    // MARK: Application state

    /// Call from `applicationDidEnterBackground`: grants the short background slice; the
    /// app is suspended when neither the slice nor a background task holds time.
    /// Returns once the new state is in force (events about it follow on the app's queue).
    public func applicationDidEnterBackground() {
        core.queue.sync { core.enterBackground() }
    }

    /// Call from `applicationWillEnterForeground`: ends running background tasks.
    public func applicationWillEnterForeground() {
        core.queue.sync { core.enterForeground() }
    }

    public var applicationState: ApplicationState { core.queue.sync { core.background.state } }

    // MARK: Background tasks

    /// Like `UIApplication.beginBackgroundTask(withName:expirationHandler:)`: returns an
    /// identifier to pass to `endBackgroundTask(_:)`, or `.invalid` when no background
    /// time can be granted (suspended, or the allowance is used up). The expiration
    /// handler runs on the app's queue shortly before the allowance ends; it must be
    /// short and should end the task.
    public func beginBackgroundTask(withName name: String? = nil, expirationHandler: (@Sendable () -> Void)? = nil) -> BackgroundTaskIdentifier {
        core.queue.sync { core.beginBackgroundTask(name: name ?? "unnamed", expirationHandler: expirationHandler) }
    }

    /// Ends a task. Ending `.invalid`, an unknown or an already ended task does nothing.
    public func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        core.queue.sync { core.endBackgroundTask(identifier) }
    }

    /// Seconds of background time left: `.greatestFiniteMagnitude` in the foreground,
    /// counting down in the background, 0 when suspended. Check it before starting work
    /// (defer the work when under ~5-10 s).
    public var backgroundTimeRemaining: Double {
        core.queue.sync { core.background.timeRemaining(now: core.clock.now()) }
    }

    // MARK: Keep-alive

    /// Like `UIApplication.setKeepAliveTimeout(_:handler:)`: refuses (returns false,
    /// installs nothing) an interval under 600 s. The handler runs on the app's queue
    /// once per interval (never later; the interval is never shorter than the server's),
    /// after the library has pinged the server or started reconnecting; each run has a
    /// 10 s budget, after which it counts as expired (`.keepAliveHandlerExpired`).
    public func setKeepAliveTimeout(_ timeout: Double, handler: @escaping @Sendable () -> Void) -> Bool {
        core.queue.sync { core.setKeepAliveTimeout(timeout, handler: handler) }
    }

    /// Sends one PING now, outside the keep-alive schedule, to measure the round trip on
    /// demand (a status display, `voipclient`'s `ping`). The PONG arrives as
    /// `.keepAliveAnswered(roundTrip:)` and sets `status.lastPongRoundTrip`; like the
    /// keep-alive's own PING, one unanswered within `pongTimeout` means the connection is
    /// dead. The schedule does not move. Returns false, sending nothing, without a live
    /// connection or while a PING is outstanding. For occasional use by a person: the
    /// protocol allows an early PING, but a phone that pings often drains its battery.
    @discardableResult
    public func pingNow() -> Bool {
        core.queue.sync { core.pingNow() }
    }

    /// Removes the app's handler; the library's own keep-alive continues at the server's
    /// interval while connected.
    public func clearKeepAliveTimeout() {
        core.queue.sync { core.clearKeepAliveTimeout() }
    }

    // MARK: Local notifications

    /// Posts a local notification (at most `notificationCapacity`, 128, pending: at the
    /// cap the oldest pending one is removed and returned in the result).
    @discardableResult
    public func postLocalNotification(_ notification: LocalNotification) -> NotificationPostResult {
        core.queue.sync { core.post(notification) }
    }

    public var pendingNotifications: [LocalNotification] { core.queue.sync { core.notifications.pending } }

    /// Removes a pending notification (the user saw it); returns whether it was pending.
    @discardableResult
    public func removePendingNotification(identifier: String) -> Bool {
        SystemNotificationBridge.remove(identifiers: [identifier])
        return core.queue.sync { core.notifications.remove(identifier: identifier) }
    }

    public func removeAllPendingNotifications() {
        core.queue.sync {
            SystemNotificationBridge.remove(identifiers: core.notifications.pending.map(\.identifier))
            core.notifications.removeAll()
        }
    }
}
