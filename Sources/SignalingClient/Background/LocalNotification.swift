import SignalingSupport

/// A local notification the client posted to get the user's attention while the app is
/// not in the foreground.
public struct LocalNotification: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        case incomingCall(callID: String, caller: String)
        /// A call that ended before it was answered (replaces its incoming-call notice).
        case missedCall(callID: String, caller: String)
        case message(messageID: String, sender: String)
        /// Posted by the app itself.
        case custom
    }

    /// Unique among pending notifications: posting with a pending identifier replaces
    /// that notification (as `UNUserNotificationCenter` does).
    public var identifier: String
    public var kind: Kind
    public var title: String
    public var body: String

    public init(identifier: String, kind: Kind = .custom, title: String, body: String) {
        self.identifier = identifier
        self.kind = kind
        self.title = title
        self.body = body
    }
}

/// What happened to a posted notification.
public enum NotificationPostResult: Sendable, Equatable {
    /// Added; the pending count grew by one.
    case posted
    /// A pending notification with the same identifier was replaced in place.
    case replaced
    /// The center was full (128 pending): the oldest pending notification was removed to
    /// make room, and is returned so the app can fold it into a summary.
    case postedRemovingOldest(LocalNotification)
    /// The notification was refused (empty identifier): nothing changed.
    case rejected(String)
}

/// The pending local notifications, capped like iOS's (128 in the article's time).
///
/// At the cap, the oldest pending notification is dropped for the new one: the newest
/// event (an incoming call now) is the one the user must see; the dropped one is
/// returned in `.postedRemovingOldest` and never vanishes silently. Owned by the
/// client's queue.
struct LocalNotificationCenter {
    static let defaultCapacity = 128

    let capacity: Int
    private(set) var pending: [LocalNotification] = []

    init(capacity: Int = LocalNotificationCenter.defaultCapacity) {
        self.capacity = max(1, capacity)
    }

    mutating func post(_ notification: LocalNotification) -> NotificationPostResult {
        guard !notification.identifier.isEmpty else { return .rejected("a notification needs an identifier") }
        if let index = pending.firstIndex(where: { $0.identifier == notification.identifier }) {
            pending[index] = notification
            return .replaced
        }
        if pending.count >= capacity {
            let oldest = pending.removeFirst()
            pending.append(notification)
            return .postedRemovingOldest(oldest)
        }
        pending.append(notification)
        return .posted
    }

    /// Removes a pending notification (the user opened it, or the app handled the event);
    /// returns whether it was pending.
    @discardableResult
    mutating func remove(identifier: String) -> Bool {
        guard let index = pending.firstIndex(where: { $0.identifier == identifier }) else { return false }
        pending.remove(at: index)
        return true
    }

    mutating func removeAll() { pending.removeAll() }

    func notification(identifier: String) -> LocalNotification? {
        pending.first { $0.identifier == identifier }
    }
}
