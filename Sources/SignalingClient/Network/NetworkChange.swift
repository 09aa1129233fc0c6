/// What the system reported about the network (a summary of one burst of netlink
/// messages, or an NWPathMonitor update).
struct NetworkChange: Sendable, Equatable {
    var addressesAdded: [SocketAddress] = []
    var addressesRemoved: [SocketAddress] = []
    var routesChanged = 0
    var linksChanged = 0
    /// Messages were lost (socket overrun) or unreadable: assume anything changed.
    var incomplete = false
}

/// Watches the system's network state and reports changes on its own thread.
protocol NetworkMonitor: AnyObject, Sendable {
    /// Starts watching; `onChange` runs on the monitor's thread.
    func start(onChange: @escaping @Sendable (NetworkChange) -> Void) throws(ConnectError)
    /// Stops watching and waits for nothing (the thread exits on its own).
    func stop()
}

/// The platform's monitor: netlink on Linux, NWPathMonitor on Apple platforms.
func makeSystemNetworkMonitor() -> (any NetworkMonitor)? {
    #if os(Linux)
    return NetlinkMonitor()
    #elseif canImport(Network)
    return PathMonitor()
    #else
    return nil
    #endif
}
