import SignalingSupport
import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

/// The socket calls the probe makes. Addresses are IPv4 in host byte order; the probe only
/// talks to loopback (127.0.0.0/8).
enum Sockets {
    /// Parses "A.B.C.D:PORT" with A = 127 and a port other than 0.
    static func parseLoopbackEndpoint(_ text: String) -> (address: UInt32, port: UInt16)? {
        guard let endpoint = SocketCalls.parseEndpoint(text), endpoint.address >> 24 == 127, endpoint.port != 0 else {
            return nil
        }
        return endpoint
    }

    static func dottedQuad(_ address: UInt32) -> String {
        "\(address >> 24).\(address >> 16 & 255).\(address >> 8 & 255).\(address & 255)"
    }

    /// A TCP socket with TCP_NODELAY (every connection of the probe, for both protocols),
    /// bound to `source` if given, with the port left to connect(2) so that each source
    /// address can use every ephemeral port towards the server.
    static func openTCP(nonBlocking: Bool, source: UInt32?) throws(ProbeError) -> Int32 {
        var type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        let fd = socket(AF_INET, type, 0)
        guard fd >= 0 else { throw ProbeError(call: "socket") }
        var yes: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
        if let source {
            setsockopt(fd, Int32(IPPROTO_IP), IP_BIND_ADDRESS_NO_PORT, &yes, socklen_t(MemoryLayout<Int32>.size))
            var local = SocketCalls.socketAddress(source, port: 0)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else {
                let error = ProbeError(call: "bind \(dottedQuad(source))")
                close(fd)
                throw error
            }
        }
        return fd
    }

    /// Starts (non-blocking socket) or performs (blocking socket) a connect. 0 when done or
    /// in progress, otherwise errno.
    static func connect(_ fd: Int32, to destination: sockaddr_in) -> Int32 {
        var remote = destination
        let result = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        if result == 0 || errno == EINPROGRESS { return 0 }
        return errno
    }

    /// Writes all of `bytes`. On a non-blocking socket a full send buffer counts as failure
    /// (the probe only writes small frames to sockets that are otherwise idle).
    static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let written = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            if written < 0 && errno == EINTR { continue }
            if written <= 0 { return false }
            offset += written
        }
        return true
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { sendAll(fd, $0) }
    }
}
