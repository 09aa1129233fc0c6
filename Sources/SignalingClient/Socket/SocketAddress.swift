#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An IPv4 or IPv6 socket address (address and port), as the kernel stores it.
public struct SocketAddress: Sendable, Hashable, CustomStringConvertible {
    /// AF_INET or AF_INET6.
    public let family: Int32
    /// The address bytes: 4 for IPv4, 16 for IPv6.
    public let addressBytes: [UInt8]
    public let port: UInt16

    public init?(family: Int32, addressBytes: [UInt8], port: UInt16) {
        guard (family == AF_INET && addressBytes.count == 4) || (family == AF_INET6 && addressBytes.count == 16)
        else { return nil }
        self.family = family
        self.addressBytes = addressBytes
        self.port = port
    }

    /// Reads a `sockaddr_in` / `sockaddr_in6`; nil for any other family.
    init?(storage: sockaddr_storage) {
        var storage = storage
        switch Int32(storage.ss_family) {
        case AF_INET:
            let value = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in.self) }
            var address = value.sin_addr
            let bytes = withUnsafeBytes(of: &address) { Array($0) }
            self.init(family: AF_INET, addressBytes: bytes, port: UInt16(bigEndian: value.sin_port))
        case AF_INET6:
            let value = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in6.self) }
            var address = value.sin6_addr
            let bytes = withUnsafeBytes(of: &address) { Array($0) }
            self.init(family: AF_INET6, addressBytes: bytes, port: UInt16(bigEndian: value.sin6_port))
        default:
            return nil
        }
    }

    /// The address without the port, e.g. "127.0.0.1" or "::1".
    public var host: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let text: UnsafePointer<CChar>? = addressBytes.withUnsafeBytes { bytes in
            buffer.withUnsafeMutableBufferPointer { out in
                inet_ntop(family, bytes.baseAddress, out.baseAddress, socklen_t(out.count))
            }
        }
        guard text != nil else { return "?" }
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    public var description: String { family == AF_INET6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// The same address with another port (0 for "any port", as the source of a probe).
    func withPort(_ port: UInt16) -> SocketAddress {
        SocketAddress(family: family, addressBytes: addressBytes, port: port)!
    }

    /// Calls `body` with a `sockaddr` pointer and length for this address.
    func withSockaddr<Result>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> Result) -> Result {
        if family == AF_INET {
            var value = sockaddr_in()
            value.sin_family = sa_family_t(AF_INET)
            value.sin_port = port.bigEndian
            withUnsafeMutableBytes(of: &value.sin_addr) { $0.copyBytes(from: addressBytes) }
            return withUnsafePointer(to: &value) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        }
        var value = sockaddr_in6()
        value.sin6_family = sa_family_t(AF_INET6)
        value.sin6_port = port.bigEndian
        withUnsafeMutableBytes(of: &value.sin6_addr) { $0.copyBytes(from: addressBytes) }
        return withUnsafePointer(to: &value) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
        }
    }

    /// Resolves `host` (a numeric address or a name) for a TCP connection to `port`.
    /// Numeric addresses never touch the resolver. Name resolution blocks and cannot be
    /// cancelled: callers run it on the connect thread, never on the client's queue.
    public static func resolve(host: String, port: UInt16) throws(ConnectError) -> [SocketAddress] {
        guard !host.isEmpty, !host.utf8.contains(0) else { throw .resolutionFailed(host: host, reason: "empty or invalid host name") }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Glibc)
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
        hints.ai_socktype = SOCK_STREAM
        #endif
        hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG
        var list: UnsafeMutablePointer<addrinfo>?
        var status = getaddrinfo(host, String(port), &hints, &list)
        if status == EAI_NONAME {
            // AI_ADDRCONFIG hides every address in a namespace that only has loopback
            // configured; ask again without it before giving up.
            hints.ai_flags = AI_NUMERICSERV
            status = getaddrinfo(host, String(port), &hints, &list)
        }
        guard status == 0, let first = list else {
            throw .resolutionFailed(host: host, reason: String(cString: gai_strerror(status)))
        }
        defer { freeaddrinfo(first) }
        var addresses: [SocketAddress] = []
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let entry = cursor {
            if let raw = entry.pointee.ai_addr {
                var storage = sockaddr_storage()
                withUnsafeMutableBytes(of: &storage) { out in
                    out.copyMemory(from: UnsafeRawBufferPointer(start: raw, count: Int(entry.pointee.ai_addrlen)))
                }
                if let address = SocketAddress(storage: storage), !addresses.contains(address) {
                    addresses.append(address)
                }
            }
            cursor = entry.pointee.ai_next
        }
        guard !addresses.isEmpty else { throw .resolutionFailed(host: host, reason: "no IPv4 or IPv6 address") }
        return addresses
    }
}
