import CLinuxShims

/// A device's IP address and port as the load balancer in front of the server saw them.
struct PeerAddress: Equatable, CustomStringConvertible {
    /// The address in network order: 4 bytes (IPv4) or 16 (IPv6).
    let bytes: [UInt8]
    let port: UInt16

    /// The hash the per-address connection cap counts under: the same as `shim_accept`'s
    /// for a direct connection from this address.
    var hash: UInt32 {
        bytes.withUnsafeBytes { UInt32(truncatingIfNeeded: shim_address_hash($0.baseAddress, $0.count)) }
    }

    /// `203.0.113.7:51234` or `[2001:db8::7]:51234`.
    var description: String {
        var text = [CChar](repeating: 0, count: 64)
        let family: Int32 = bytes.count == 16 ? 6 : 4
        guard bytes.withUnsafeBytes({ shim_format_address(family, $0.baseAddress, port, &text, text.count) }) == 0 else { return "-" }
        return String(cString: text)
    }

    /// The other end of a connected socket, formatted like `description`; `-` if unknown.
    static func ofPeer(socket fd: Int32) -> String {
        var text = [CChar](repeating: 0, count: 64)
        guard shim_peer_address(fd, &text, text.count) == 0 else { return "-" }
        return String(cString: text)
    }
}

/// The PROXY protocol version 2 header a load balancer (HAProxy `send-proxy-v2`, AWS NLB,
/// Google Cloud, Azure) sends first on each connection it opens to the server, naming the
/// client it forwards (haproxy's doc/proxy-protocol.txt, section 2.2):
///
///     12 bytes  signature \r\n\r\n\0\r\nQUIT\n
///      1 byte   version (high nibble, 2) and command (low nibble: 0 LOCAL, 1 PROXY)
///      1 byte   address family (high: 0 UNSPEC, 1 INET, 2 INET6, 3 UNIX) and transport
///               (low: 0 UNSPEC, 1 STREAM, 2 DGRAM)
///      2 bytes  length of the rest, big-endian
///     INET:  source, destination address (4 bytes each), source, destination port (2 each)
///     INET6: the same with 16-byte addresses; then TLVs up to the length, skipped here
///
/// Only what a device connection can be is accepted: PROXY over TCP from IPv4 or IPv6,
/// and LOCAL (the balancer's own connection, such as a health check) or UNSPEC, which
/// keep the socket's own address. Parsing is pure: it reads only the bytes it is given.
struct ProxyHeader: Equatable {
    /// The device's address; nil for LOCAL and UNSPEC, where the socket's address stands.
    let source: PeerAddress?
    /// Bytes the header takes, TLVs included: the device's own bytes follow.
    let length: Int

    enum Parse: Equatable {
        /// A valid beginning: wait for more bytes.
        case incomplete
        case complete(ProxyHeader)
        /// Not a header this server accepts; the reason is for the balancer's operator.
        case invalid(String)
    }

    static let signature: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A]
    /// The fixed part: signature, version and command, family and transport, length.
    static let fixedLength = 16
    /// Largest header accepted. Addresses take 36 bytes at most; the rest are TLVs, which
    /// balancers keep small (an AWS endpoint id, a TLS version, a unique id). The partial
    /// header waits in the connection's `inbound` until complete, so this bounds it.
    static let maximumLength = 1024

    static func parse(_ bytes: UnsafeRawBufferPointer) -> Parse {
        let prefix = min(bytes.count, signature.count)
        guard bytes.prefix(prefix).elementsEqual(signature.prefix(prefix)) else {
            if bytes.starts(with: "PROXY ".utf8.prefix(bytes.count)) {
                return .invalid("a PROXY protocol version 1 (text) header; only version 2 is accepted (haproxy: send-proxy-v2)")
            }
            return .invalid("no PROXY protocol version 2 header, which this listener requires first (--proxy-protocol)")
        }
        guard bytes.count >= fixedLength else { return .incomplete }
        let version = bytes[12] >> 4, command = bytes[12] & 0x0F
        let family = bytes[13] >> 4, transport = bytes[13] & 0x0F
        let length = fixedLength + (Int(bytes[14]) << 8 | Int(bytes[15]))
        guard version == 2 else { return .invalid("PROXY protocol version \(version); only version 2 is accepted") }
        guard command <= 1 else { return .invalid("unknown PROXY protocol command \(command)") }
        guard length <= maximumLength else {
            return .invalid("a PROXY header of \(length) bytes; at most \(maximumLength) are accepted")
        }
        // LOCAL: the balancer speaks for itself (a health check); any addresses mean nothing.
        if command == 0 {
            return bytes.count >= length ? .complete(ProxyHeader(source: nil, length: length)) : .incomplete
        }
        let addressLength: Int
        switch family {
        case 0: addressLength = 0
        case 1: addressLength = 12
        case 2: addressLength = 36
        default: return .invalid("PROXY address family \(family); only IPv4 and IPv6 are accepted")
        }
        guard length >= fixedLength + addressLength else {
            return .invalid("a PROXY header of \(length) bytes is too short for its addresses")
        }
        guard family == 0 || transport == 1 else { return .invalid("PROXY transport \(transport); only TCP (stream) is accepted") }
        guard bytes.count >= length else { return .incomplete }
        // UNSPEC: the balancer does not know the client's address; the socket's stands.
        guard family != 0 else { return .complete(ProxyHeader(source: nil, length: length)) }
        let size = addressLength == 12 ? 4 : 16
        let address = Array(bytes[fixedLength..<(fixedLength + size)])
        let portOffset = fixedLength + 2 * size
        let port = UInt16(bytes[portOffset]) << 8 | UInt16(bytes[portOffset + 1])
        return .complete(ProxyHeader(source: PeerAddress(bytes: address, port: port), length: length))
    }
}
