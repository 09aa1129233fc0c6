#if canImport(Glibc)
import Glibc
#endif

/// A numeric IPv4 or IPv6 address and a UDP port: where probe packets go, or where the
/// probe socket is bound. Host names are not accepted: the offer and answer carry
/// addresses, as SDP's `c=` line does.
public struct UDPEndpoint: Sendable, Hashable, CustomStringConvertible {
    public let host: String
    public let port: UInt16
    /// AF_INET or AF_INET6.
    public let family: Int32
    /// 4 or 16 bytes, network order.
    let addressBytes: [UInt8]

    /// Nil when `host` is not a numeric address.
    public init?(host: String, port: UInt16) {
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            family = AF_INET
            addressBytes = withUnsafeBytes(of: &v4) { Array($0) }
        } else if inet_pton(AF_INET6, host, &v6) == 1 {
            family = AF_INET6
            addressBytes = withUnsafeBytes(of: &v6) { Array($0) }
        } else {
            return nil
        }
        self.host = host
        self.port = port
    }

    /// From a kernel address; nil for other families.
    init?(storage: sockaddr_storage) {
        var storage = storage
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let port: UInt16
        switch Int32(storage.ss_family) {
        case AF_INET:
            var value = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in.self) }
            inet_ntop(AF_INET, &value.sin_addr, &buffer, socklen_t(buffer.count))
            port = UInt16(bigEndian: value.sin_port)
        case AF_INET6:
            var value = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in6.self) }
            inet_ntop(AF_INET6, &value.sin6_addr, &buffer, socklen_t(buffer.count))
            port = UInt16(bigEndian: value.sin6_port)
        default:
            return nil
        }
        let text = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        self.init(host: text, port: port)
    }

    public func withPort(_ port: UInt16) -> UDPEndpoint { UDPEndpoint(host: host, port: port)! }

    /// Calls `body` with this endpoint as a `sockaddr`.
    func withSocketAddress<Result>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> Result) -> Result {
        var storage = sockaddr_storage()
        let length: socklen_t
        if family == AF_INET {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            withUnsafeMutableBytes(of: &address.sin_addr) { $0.copyBytes(from: addressBytes) }
            withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: address, as: sockaddr_in.self) }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &address.sin6_addr) { $0.copyBytes(from: addressBytes) }
            withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: address, as: sockaddr_in6.self) }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        }
        return withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) }
        }
    }

    /// "127.0.0.1:40000" or "[::1]:40000".
    public var description: String { family == AF_INET6 ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
