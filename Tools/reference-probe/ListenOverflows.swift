#if canImport(Glibc)
import Glibc
#endif

/// The kernel's count of connections dropped because a listener's accept queue was full
/// (TcpExt ListenOverflows in /proc/net/netstat, for the whole network namespace). Each
/// such drop costs the client a SYN retransmission, one second or more, so a ramp that
/// overflows the server's backlog measures the backlog rather than the server.
enum ListenOverflows {
    static func current() -> UInt64? {
        let fd = open("/proc/net/netstat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var contents: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 8192)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            contents.append(contentsOf: chunk[0..<count])
        }
        // Two "TcpExt:" lines: the field names, then their values.
        let lines = String(decoding: contents, as: UTF8.self).split(separator: "\n").filter { $0.hasPrefix("TcpExt:") }
        guard lines.count >= 2 else { return nil }
        let names = lines[0].split(separator: " ")
        let values = lines[1].split(separator: " ")
        guard let position = names.firstIndex(of: "ListenOverflows"), position < values.count else { return nil }
        return UInt64(values[position])
    }
}
