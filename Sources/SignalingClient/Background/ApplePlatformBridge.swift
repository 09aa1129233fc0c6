#if canImport(UIKit) && os(iOS)
import UIKit
import Synchronization

/// On iOS the library's model is mirrored into the real system, so iOS actually grants
/// the time the model says the app has, and wakes it for the keep-alive:
/// - each background task the app begins also begins a `UIApplication` background task,
///   ended with it (or when the model ends it: expiry, return to the foreground);
/// - `setKeepAliveTimeout` also installs the system keep-alive handler (the only timer
///   that runs a suspended VoIP app), which runs the library's keep-alive at once.
/// UIKit is main-actor only, so every call hops to the main queue.
enum ApplePlatformBridge {
    /// The library's task identifiers → UIKit's.
    private static let systemTasks = Mutex<[Int: UIBackgroundTaskIdentifier]>([:])

    static func taskBegan(_ identifier: BackgroundTaskIdentifier, name: String) {
        let key = identifier.rawValue
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                let systemID = UIApplication.shared.beginBackgroundTask(withName: name) {
                    // The library runs its own expiration handlers from its clock; here
                    // only make sure iOS never kills the app for an unended task.
                    if let id = systemTasks.withLock({ $0.removeValue(forKey: key) }) {
                        UIApplication.shared.endBackgroundTask(id)
                    }
                }
                systemTasks.withLock { $0[key] = systemID }
            }
        }
    }

    static func taskEnded(_ identifier: BackgroundTaskIdentifier) {
        let key = identifier.rawValue
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                if let id = systemTasks.withLock({ $0.removeValue(forKey: key) }) {
                    UIApplication.shared.endBackgroundTask(id)
                }
            }
        }
    }

    static func installKeepAlive(interval: Double, handler: @escaping @Sendable () -> Void) {
        DispatchQueue.main.async {
            MainActor.assumeIsolated {
                _ = UIApplication.shared.setKeepAliveTimeout(interval, handler: handler)
            }
        }
    }

    static func clearKeepAlive() {
        DispatchQueue.main.async {
            MainActor.assumeIsolated { UIApplication.shared.clearKeepAliveTimeout() }
        }
    }
}
#endif
