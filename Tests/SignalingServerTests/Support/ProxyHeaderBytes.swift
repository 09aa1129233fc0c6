/// PROXY protocol version 2 headers as a load balancer sends them, written out from the
/// specification (haproxy's doc/proxy-protocol.txt, 2.2), independently of the server's
/// parser.
enum ProxyHeaderBytes {
    static let signature: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A]

    /// version 2 | command (0 LOCAL, 1 PROXY); family << 4 | transport; the length of the
    /// rest; then `rest`.
    static func header(command: UInt8 = 1, family: UInt8, transport: UInt8 = 1, rest: [UInt8]) -> [UInt8] {
        signature + [0x20 | command, family << 4 | transport, UInt8(rest.count >> 8), UInt8(rest.count & 0xFF)] + rest
    }

    /// PROXY over TCP/IPv4 from `source` (dotted quad) to 10.0.0.1:7443, then `tlvs`.
    static func ipv4(_ source: String, port: UInt16, tlvs: [UInt8] = []) -> [UInt8] {
        let address = source.split(separator: ".").map { UInt8($0)! }
        return header(family: 1, rest: address + [10, 0, 0, 1] + bytes(port) + bytes(7443) + tlvs)
    }

    /// PROXY over TCP/IPv6 from 2001:db8::<last> to 2001:db8::1, port 7443.
    static func ipv6(last: UInt8, port: UInt16) -> [UInt8] {
        let prefix: [UInt8] = [0x20, 0x01, 0x0d, 0xb8] + Array(repeating: 0, count: 11)
        return header(family: 2, rest: prefix + [last] + prefix + [1] + bytes(port) + bytes(7443))
    }

    /// LOCAL (a health check of the balancer), with no addresses.
    static let local = header(command: 0, family: 0, transport: 0, rest: [])

    static func bytes(_ value: UInt16) -> [UInt8] { [UInt8(value >> 8), UInt8(value & 0xFF)] }
}
