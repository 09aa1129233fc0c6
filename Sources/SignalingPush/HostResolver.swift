#if canImport(Glibc)
import Glibc
#endif

/// Turns the gateway's host name into an IP literal once, when the gateway starts.
/// libevent would otherwise resolve the name with a blocking getaddrinfo on the
/// gateway's thread before every new connection (no evdns base is configured), stalling
/// every other request meanwhile.
enum HostResolver {
    /// The first address `host` resolves to, as a numeric string. IP literals are
    /// returned unchanged (no lookup happens).
    static func numericAddress(of host: String) throws(PushGatewayError) -> String {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &result)
        guard status == 0, let first = result else {
            throw PushGatewayError("cannot resolve push gateway host '\(host)': \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(result) }
        var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        let rc = getnameinfo(first.pointee.ai_addr, first.pointee.ai_addrlen, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST)
        guard rc == 0 else {
            throw PushGatewayError("cannot format the address of '\(host)': \(String(cString: gai_strerror(rc)))")
        }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// The gateway cannot start.
public struct PushGatewayError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}
