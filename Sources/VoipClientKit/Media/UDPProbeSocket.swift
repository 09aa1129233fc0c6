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
        let fd = try SystemCall.run("socket") {
            socket(endpoint.family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        }
        do throws(SystemError) {
            try SystemCall.run("bind \(endpoint)") { endpoint.withSocketAddress { bind(fd, $0, $1) } }
        } catch {
            Glibc.close(fd)
            throw error
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
            let result = SystemCall.io {
                buffer.withUnsafeMutableBytes { bytes in
                    withUnsafeMutablePointer(to: &storage) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            recvfrom(descriptor, bytes.baseAddress, bytes.count, 0, $0, &length)
                        }
                    }
                }
            }
            switch result {
            case .transferred(let count):
                guard let source = UDPEndpoint(storage: storage) else { continue }
                return (count, source)
            case .wouldBlock: return nil
            // ECONNREFUSED and friends (an ICMP error for an earlier send) are not data.
            case .failed: return (0, local)
            }
        }
    }

    func close() { Glibc.close(descriptor) }
}
