import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A non-blocking UDP socket bound to one address: the probe's only socket. Owned by
/// the probe's thread once the probe has started (before that, by whoever made it).
final class UDPProbeSocket {
    let descriptor: Int32
    /// Where it is bound (the port the kernel picked when asked for 0).
    let local: UDPEndpoint

    init(bindingTo endpoint: UDPEndpoint) throws(SystemError) {
        let fd = socket(endpoint.family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket", errno) }
        let bound = endpoint.withSocketAddress { bind(fd, $0, $1) }
        guard bound == 0 else {
            let code = errno
            Glibc.close(fd)
            throw SystemError("bind \(endpoint)", code)
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0, let local = UDPEndpoint(storage: storage) else {
            let code = errno
            Glibc.close(fd)
            throw SystemError("getsockname", code)
        }
        descriptor = fd
        self.local = local
    }

    /// Sends one datagram; false when the kernel refused it (no route, buffer full...),
    /// which the probe counts as a lost packet.
    @discardableResult
    func send(_ bytes: [UInt8], to destination: UDPEndpoint) -> Bool {
        guard destination.family == local.family else { return false }
        let sent = bytes.withUnsafeBytes { buffer in
            destination.withSocketAddress { address, length in
                sendto(descriptor, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL), address, length)
            }
        }
        return sent == bytes.count
    }

    /// The next datagram waiting, or nil when there is none.
    func receive(into buffer: inout [UInt8]) -> (count: Int, from: UDPEndpoint)? {
        while true {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let count = buffer.withUnsafeMutableBytes { bytes in
                withUnsafeMutablePointer(to: &storage) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        recvfrom(descriptor, bytes.baseAddress, bytes.count, 0, $0, &length)
                    }
                }
            }
            if count < 0 && errno == EINTR { continue }
            // ECONNREFUSED and friends (an ICMP error for an earlier send) are not data.
            if count < 0 { return errno == EAGAIN || errno == EWOULDBLOCK ? nil : (0, local) }
            guard let source = UDPEndpoint(storage: storage) else { continue }
            return (count, source)
        }
    }

    func close() { Glibc.close(descriptor) }
}
