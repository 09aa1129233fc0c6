#if canImport(Glibc)
import Glibc
#endif

/// The resident memory of the server under test, from /proc/PID/status.
enum ServerMemory {
    /// VmRSS in bytes; nil if the process or the line is not there.
    static func residentBytes(pid: Int32) -> UInt64? {
        guard let status = readFile("/proc/\(pid)/status") else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            // "VmRSS:	   12345 kB"
            let fields = line.dropFirst("VmRSS:".count).split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count == 2, fields[1] == "kB", let kilobytes = UInt64(fields[0]) else { return nil }
            return kilobytes * 1024
        }
        return nil
    }

    private static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var contents: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            contents.append(contentsOf: chunk[0..<count])
        }
        return String(decoding: contents, as: UTF8.self)
    }
}
