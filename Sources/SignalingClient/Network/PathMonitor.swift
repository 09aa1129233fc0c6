#if !os(Linux) && canImport(Network)
import Network
import Synchronization

/// Apple-platform network monitor: `NWPathMonitor`. Every path update is reported as an
/// incomplete change, and the client re-evaluates its socket's path (the same check as
/// on Linux: is the local address still there, would the system pick another one).
final class PathMonitor: NetworkMonitor {
    private let monitor = NWPathMonitor()
    private let queue = DispatchQueue(label: "vsig.path-monitor")

    func start(onChange: @escaping @Sendable (NetworkChange) -> Void) throws(ConnectError) {
        monitor.pathUpdateHandler = { _ in
            var change = NetworkChange()
            change.incomplete = true
            onChange(change)
        }
        monitor.start(queue: queue)
    }

    func stop() { monitor.cancel() }
}
#endif
