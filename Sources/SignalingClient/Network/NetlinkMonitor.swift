#if os(Linux)
import SignalingSupport
import CLinuxShims
import Foundation
import Synchronization
import Glibc

/// Linux network monitor: an rtnetlink socket subscribed to address, route and link
/// changes (RTMGRP_IPV4/6_IFADDR, RTMGRP_IPV4/6_ROUTE, RTMGRP_LINK), read on a thread of
/// its own. Each burst of messages (everything readable at once) becomes one
/// `NetworkChange`, so deleting an address and its routes is one report, not five.
final class NetlinkMonitor: NetworkMonitor {
    private let wakeup: WakePipe?
    private let stopped = Atomic<Bool>(false)
    private let started = Atomic<Bool>(false)

    init() { wakeup = try? WakePipe() }

    func start(onChange: @escaping @Sendable (NetworkChange) -> Void) throws(ConnectError) {
        guard let wakeup else { throw .socketError(operation: "eventfd", errno: errno) }
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let fd = vsig_netlink_open_route_monitor()
        guard fd >= 0 else { throw .socketError(operation: "netlink socket", errno: errno) }
        let thread = Thread { [self] in
            defer { close(fd) }
            run(fd: fd, wakeup: wakeup, onChange: onChange)
        }
        thread.name = "vsig-netlink"
        thread.start()
    }

    func stop() {
        stopped.store(true, ordering: .releasing)
        wakeup?.signal()
    }

    private func run(fd: Int32, wakeup: WakePipe, onChange: @Sendable (NetworkChange) -> Void) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while !stopped.load(ordering: .acquiring) {
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: wakeup.readDescriptor, events: Int16(POLLIN), revents: 0)]
            guard case .transferred = SystemCall.io({ Int(poll(&fds, 2, -1)) }) else { return }
            if fds[1].revents != 0 { continue }  // stop() was called; the loop condition ends it
            var change = NetworkChange()
            var received = false
            readBurst: while true {
                switch SystemCall.io({ buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) } }) {
                case .transferred(let count) where count > 0:
                    received = true
                    var summary = vsig_netlink_summary()
                    buffer.withUnsafeBytes { vsig_netlink_summarize($0.baseAddress, count, &summary) }
                    Self.merge(summary, into: &change)
                case .failed(errno: ENOBUFS):
                    // The kernel dropped messages: what changed is not all known.
                    change.incomplete = true
                    received = true
                case .transferred, .wouldBlock, .failed:
                    break readBurst  // the burst is read completely (EAGAIN), or the socket failed
                }
            }
            if received && !stopped.load(ordering: .acquiring) { onChange(change) }
        }
    }

    private static func merge(_ summary: vsig_netlink_summary, into change: inout NetworkChange) {
        change.routesChanged += Int(summary.routes_changed)
        change.linksChanged += Int(summary.links_changed)
        if summary.malformed != 0 || summary.truncated != 0 { change.incomplete = true }
        var addresses = summary.addresses
        let count = Int(summary.address_count)
        withUnsafeBytes(of: &addresses) { raw in
            let list = raw.bindMemory(to: vsig_netlink_address.self)
            for entry in list.prefix(count) {
                var bytes = entry.bytes
                let all = withUnsafeBytes(of: &bytes) { Array($0) }
                let length = entry.family == AF_INET ? 4 : 16
                guard let address = SocketAddress(family: entry.family, addressBytes: Array(all.prefix(length)), port: 0) else { continue }
                if entry.removed != 0 { change.addressesRemoved.append(address) } else { change.addressesAdded.append(address) }
            }
        }
    }
}
#endif
