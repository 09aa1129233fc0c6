#if canImport(Glibc)
import Glibc
#endif

/// Readers for the /proc files the benchmark reports from. Parsing is separate from
/// reading so that the parsers can be tested on fixed text.
public enum ProcessStats {
    /// Resident set size in bytes, from the `VmRSS:` line of /proc/<pid>/status.
    public static func parseResidentBytes(status: String) -> UInt64? {
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            // "VmRSS:    12345 kB"
            guard fields.count >= 3, let kilobytes = UInt64(fields[1]), fields[2] == "kB" else { return nil }
            return kilobytes * 1024
        }
        return nil
    }

    /// User plus system CPU time in clock ticks, from /proc/<pid>/stat. The command name
    /// (field 2) may contain spaces and parentheses, so fields are counted after the last
    /// ')'; utime and stime are fields 14 and 15.
    public static func parseCPUTicks(stat: String) -> UInt64? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        let rest = stat[stat.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        // rest[0] is field 3 (state); field n is rest[n - 3].
        guard rest.count > 12, let user = UInt64(rest[11]), let system = UInt64(rest[12]) else { return nil }
        return user + system
    }

    /// The TCP line of /proc/net/sockstat: sockets in use and kernel memory in pages.
    public struct SocketSummary: Codable, Sendable, Equatable {
        public var tcpInUse: UInt64
        /// Pages of memory held by TCP socket buffers, both ends of every loopback pair.
        public var tcpMemoryPages: UInt64

        public init(tcpInUse: UInt64, tcpMemoryPages: UInt64) {
            self.tcpInUse = tcpInUse
            self.tcpMemoryPages = tcpMemoryPages
        }
    }

    /// Parses "TCP: inuse 5 orphan 0 tw 0 alloc 7 mem 1".
    public static func parseSocketSummary(sockstat: String) -> SocketSummary? {
        for line in sockstat.split(separator: "\n") where line.hasPrefix("TCP:") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            var values: [Substring: UInt64] = [:]
            var index = 1
            while index + 1 < fields.count {
                values[fields[index]] = UInt64(fields[index + 1])
                index += 2
            }
            guard let inUse = values["inuse"], let memory = values["mem"] else { return nil }
            return SocketSummary(tcpInUse: inUse, tcpMemoryPages: memory)
        }
        return nil
    }

    public static func residentBytes(pid: Int32) -> UInt64? {
        readFile("/proc/\(pid)/status").flatMap(parseResidentBytes(status:))
    }

    public static func cpuSeconds(pid: Int32) -> Double? {
        guard let ticks = readFile("/proc/\(pid)/stat").flatMap(parseCPUTicks(stat:)) else { return nil }
        return Double(ticks) / Double(clockTicksPerSecond)
    }

    public static func socketSummary() -> SocketSummary? {
        readFile("/proc/net/sockstat").flatMap(parseSocketSummary(sockstat:))
    }

    public static var pageSize: UInt64 { UInt64(sysconf(Int32(_SC_PAGESIZE))) }
    static var clockTicksPerSecond: Int { max(1, sysconf(Int32(_SC_CLK_TCK))) }

    /// A small text file from /proc (read in one go; these files have no size on stat).
    public static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 { if errno == EINTR { continue } else { return nil } }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
