#if canImport(UserNotifications) && !os(Linux)
import UserNotifications
#endif

/// Hands posted notifications to the platform's notification center where there is one.
/// On Linux there is none: the pending list of the client is the notification center,
/// and the app shows them from `ClientEvent.notificationPosted`.
enum SystemNotificationBridge {
    static func post(_ notification: LocalNotification, result: NotificationPostResult) {
        #if canImport(UserNotifications) && !os(Linux)
        let center = UNUserNotificationCenter.current()
        if case .postedRemovingOldest(let oldest) = result {
            center.removePendingNotificationRequests(withIdentifiers: [oldest.identifier])
            center.removeDeliveredNotifications(withIdentifiers: [oldest.identifier])
        }
        if case .rejected = result { return }
        let content = UNMutableNotificationContent()
        content.title = notification.title
        content.body = notification.body
        center.add(UNNotificationRequest(identifier: notification.identifier, content: content, trigger: nil))
        #endif
    }

    static func remove(identifiers: [String]) {
        #if canImport(UserNotifications) && !os(Linux)
        UNUserNotificationCenter.current().removePendingNotificationRequests(withIdentifiers: identifiers)
        UNUserNotificationCenter.current().removeDeliveredNotifications(withIdentifiers: identifiers)
        #endif
    }
}
