#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Decides whether a network change affects a connection: is its local address still
/// configured, and would the system still reach the server from it.
enum PathEvaluator {
    static func evaluate(local: SocketAddress, remote: SocketAddress) -> NetworkPathChange? {
        guard isConfigured(local) else { return .localAddressRemoved(local) }
        if let preferred = preferredSource(toward: remote), preferred.addressBytes != local.addressBytes {
            return .betterPathAvailable(from: local, to: preferred)
        }
        return nil
    }

    /// True when some interface has `address` (port ignored).
    static func isConfigured(_ address: SocketAddress) -> Bool {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return true }  // cannot tell: assume yes
        defer { freeifaddrs(first) }
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            if let raw = entry.pointee.ifa_addr, Int32(raw.pointee.sa_family) == address.family {
                var storage = sockaddr_storage()
                let size = address.family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: UnsafeRawBufferPointer(start: raw, count: size)) }
                if let configured = SocketAddress(storage: storage), configured.addressBytes == address.addressBytes { return true }
            }
            cursor = entry.pointee.ifa_next
        }
        return false
    }

    /// The source address the routing table picks for `remote` now. Connecting a UDP
    /// socket only consults the routing table; no packet is sent.
    static func preferredSource(toward remote: SocketAddress) -> SocketAddress? {
        #if canImport(Glibc)
        let fd = socket(remote.family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        #else
        let fd = socket(remote.family, SOCK_DGRAM, 0)
        #endif
        guard fd >= 0 else { return nil }
        let probe = SocketHandle(descriptor: fd)
        defer { probe.close() }
        let status = remote.withSockaddr { pointer, length in
            #if canImport(Glibc)
            Glibc.connect(fd, pointer, length)
            #else
            Darwin.connect(fd, pointer, length)
            #endif
        }
        guard status == 0 else { return nil }
        return probe.localAddress()?.withPort(0)
    }
}
