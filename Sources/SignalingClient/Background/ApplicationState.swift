/// The app's execution state, as iOS models it (seed digest §2, §4).
public enum ApplicationState: String, Sendable, Equatable, CustomStringConvertible {
    /// On screen: everything runs, background time is unlimited.
    case foreground
    /// Off screen but running: during the slice after entering the background or after a
    /// wake, or while background tasks hold time.
    case background
    /// Off screen and not running: only the three wake reasons bring it back.
    case suspended

    public var description: String { rawValue }
}

/// Why a suspended app was given a slice of time: the article's three reasons, and the
/// push that today's phones use instead of a socket kept open in the background.
public enum WakeReason: String, Sendable, Equatable, CaseIterable, CustomStringConvertible {
    /// Data arrived on the marked socket.
    case socketData
    /// A network change may affect whether the server is reachable.
    case networkChange
    /// The keep-alive timer fired the keep-alive handler.
    case keepAliveTimer
    /// A push wake-up arrived (`SignalingClient.handleWakeUp`): a PushKit VoIP push, an
    /// FCM high-priority message, a background notification.
    case pushNotification

    public var description: String { rawValue }
}

/// Identifies a background task, like `UIBackgroundTaskIdentifier`.
public struct BackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// Returned when no background time can be granted; ending it does nothing.
    public static let invalid = BackgroundTaskIdentifier(rawValue: 0)

    public var description: String { self == .invalid ? "invalid" : "task-\(rawValue)" }
}

/// The time the simulated system grants. Defaults follow today's iOS.
public struct BackgroundExecutionPolicy: Sendable, Equatable {
    /// The slice granted on entering the background and on each wake.
    public var wakeSlice: Duration = .seconds(10)
    /// Extra time that background tasks hold, counted from the first task begun in a
    /// background period (about 30 s on current iOS; 180 s on iOS 7, 600 s on iOS 4).
    public var taskAllowance: Duration = .seconds(30)
    /// How long before the end of the allowance the expiration handlers run.
    public var expirationWarning: Duration = .seconds(5)

    public init() {}
}
