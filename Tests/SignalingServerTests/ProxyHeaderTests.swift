import CLinuxShims
import SignalingProtocol
@testable import SignalingServer
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The PROXY protocol version 2 parser on its own: what it accepts, and that it refuses
/// everything else at the first byte that shows it.
@Suite("PROXY protocol v2 header")
struct ProxyHeaderTests {
    private func parse(_ bytes: [UInt8]) -> ProxyHeader.Parse {
        bytes.withUnsafeBytes { ProxyHeader.parse($0) }
    }

    private func invalidReason(_ bytes: [UInt8]) -> String? {
        if case .invalid(let reason) = parse(bytes) { return reason }
        return nil
    }

    @Test("an IPv4 header names the device's address and port, and how long it is")
    func ipv4() {
        let header = ProxyHeaderBytes.ipv4("203.0.113.7", port: 51234)
        let hello = FrameEncoder.encode(.hello(Hello(userID: "alice", deviceID: "d")))
        let parsed = parse(header + hello)
        #expect(parsed == .complete(ProxyHeader(source: PeerAddress(bytes: [203, 0, 113, 7], port: 51234), length: 28)))
        if case .complete(let proxy) = parsed { #expect(proxy.source?.description == "203.0.113.7:51234") }
    }

    @Test("an IPv6 header names the device's address and port")
    func ipv6() {
        guard case .complete(let proxy) = parse(ProxyHeaderBytes.ipv6(last: 7, port: 443)) else {
            Issue.record("not parsed")
            return
        }
        #expect(proxy.length == 52)
        #expect(proxy.source?.description == "[2001:db8::7]:443")
    }

    @Test("TLVs after the addresses are skipped: the device's bytes start after them")
    func tlvsAreSkipped() {
        // PP2_TYPE_AUTHORITY "example.com" and PP2_TYPE_UNIQUE_ID of 4 bytes.
        let tlvs: [UInt8] = [0x02, 0x00, 11] + Array("example.com".utf8) + [0x05, 0x00, 4, 1, 2, 3, 4]
        let header = ProxyHeaderBytes.ipv4("198.51.100.9", port: 1000, tlvs: tlvs)
        guard case .complete(let proxy) = parse(header + [0xAA, 0xBB]) else {
            Issue.record("not parsed")
            return
        }
        #expect(proxy.length == header.count && proxy.length == 28 + tlvs.count)
        #expect(proxy.source?.description == "198.51.100.9:1000")
    }

    @Test("LOCAL (a balancer's health check) and UNSPEC keep the socket's own address")
    func localAndUnspecified() {
        #expect(parse(ProxyHeaderBytes.local) == .complete(ProxyHeader(source: nil, length: 16)))
        // LOCAL with addresses (haproxy's checks send them): still the socket's address.
        let localWithAddresses = ProxyHeaderBytes.header(command: 0, family: 1, rest: [1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2])
        #expect(parse(localWithAddresses) == .complete(ProxyHeader(source: nil, length: 28)))
        // PROXY for a client the balancer cannot describe (such as a UNIX socket it relays).
        let unspecified = ProxyHeaderBytes.header(command: 1, family: 0, transport: 0, rest: [])
        #expect(parse(unspecified) == .complete(ProxyHeader(source: nil, length: 16)))
    }

    @Test("every strict prefix of a header is incomplete, so a header split across reads waits for the rest")
    func truncated() {
        for header in [ProxyHeaderBytes.ipv4("203.0.113.7", port: 1), ProxyHeaderBytes.ipv6(last: 1, port: 2), ProxyHeaderBytes.local] {
            for cut in 0..<header.count {
                #expect(parse(Array(header[..<cut])) == .incomplete, "cut at \(cut)")
            }
        }
    }

    @Test("bytes that cannot begin a version 2 header are refused at the first one that shows it")
    func badSignature() throws {
        let hello = FrameEncoder.encode(.hello(Hello(userID: "alice", deviceID: "d")))
        #expect(try #require(invalidReason(hello)).contains("no PROXY protocol version 2 header"))
        #expect(invalidReason([hello[0]]) != nil)
        var corrupted = ProxyHeaderBytes.local
        corrupted[7] ^= 0xFF
        #expect(invalidReason(Array(corrupted[..<8])) != nil)
        // haproxy's `send-proxy` (version 1, text) instead of `send-proxy-v2`.
        let text = Array("PROXY TCP4 203.0.113.7 10.0.0.1 51234 7443\r\n".utf8)
        #expect(try #require(invalidReason(text)).contains("version 1"))
        #expect(try #require(invalidReason(Array(text[..<3]))).contains("version 1"))
    }

    @Test("a length past the limit is refused from the fixed part alone, before any of it is kept")
    func oversizedLength() throws {
        var fixed = ProxyHeaderBytes.header(family: 1, rest: [])
        fixed[14] = 0xFF
        fixed[15] = 0xFF
        #expect(try #require(invalidReason(fixed)).contains("65551 bytes"))
        // The largest accepted one is complete once all its bytes are there.
        let tlv = [UInt8(0x04), UInt8((ProxyHeader.maximumLength - 31) >> 8), UInt8((ProxyHeader.maximumLength - 31) & 0xFF)]
            + Array(repeating: 0, count: ProxyHeader.maximumLength - 31)
        let largest = ProxyHeaderBytes.ipv4("203.0.113.7", port: 1, tlvs: tlv)
        #expect(largest.count == ProxyHeader.maximumLength)
        guard case .complete(let proxy) = parse(largest) else {
            Issue.record("the largest header was refused")
            return
        }
        #expect(proxy.length == ProxyHeader.maximumLength)
    }

    @Test("other versions, commands, families and transports are refused", arguments: [
        ([UInt8(0x11), 0x11], "version 1"),  // binary, version 1
        ([0x22, 0x11], "command 2"),
        ([0x21, 0x31], "family 3"),  // AF_UNIX
        ([0x21, 0x12], "transport 2"),  // UDP
        ([0x21, 0x21], "too short"),  // IPv6 with IPv4's 12 bytes
    ])
    func unsupported(versionCommandFamily: [UInt8], expected: String) throws {
        let header = ProxyHeaderBytes.signature + versionCommandFamily + [0, 12] + Array(repeating: 1, count: 12)
        #expect(try #require(invalidReason(header)).contains(expected))
    }

    @Test("an address from a header is counted under the same hash as a direct connection from it")
    func sameHashAsAccept() throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) } }
        #expect(listen(listener, 4) == 0)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) } }
        let client = try TestClient(port: UInt16(bigEndian: address.sin_port), sourceAddress: "127.0.0.9")
        var hash: UInt64 = 0
        let accepted = shim_accept(listener, &hash)
        defer { close(accepted) }
        #expect(accepted >= 0)
        #expect(PeerAddress(bytes: [127, 0, 0, 9], port: 1).hash == UInt32(truncatingIfNeeded: hash))
        #expect(PeerAddress(bytes: [127, 0, 0, 10], port: 1).hash != UInt32(truncatingIfNeeded: hash))
        _ = client
    }

    @Test("a connection's state stays 64 bytes: the PROXY header state lives in its flags and its inbound buffer")
    func connectionStateSize() {
        #expect(MemoryLayout<ConnectionState>.size <= 64)
        #expect(MemoryLayout<ConnectionState>.stride == 64)
    }
}
