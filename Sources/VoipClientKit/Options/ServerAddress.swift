import SignalingClient
import SignalingSupport

/// A `--server` entry: the client library's endpoint, parsed from the command line.
public typealias ServerAddress = ServerEndpoint

/// `--server HOST:PORT[,HOST:PORT...]`: each a host name, an IPv4 address or a bracketed
/// IPv6 address, and a port. Without a port the server's default, 7443, is used.
extension ServerEndpoint {
    public static let defaultPort: UInt16 = 7443

    /// A comma-separated list, in the order of preference (at least one).
    public static func parseList(_ text: String) throws(UsageError) -> [ServerEndpoint] {
        var servers: [ServerEndpoint] = []
        for entry in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard !entry.isEmpty else { throw UsageError("--server: an empty entry in '\(text)'") }
            servers.append(try ServerEndpoint(parsing: String(entry)))
        }
        return servers
    }

    /// The list as `--server` takes it.
    public static func describe(_ servers: [ServerEndpoint]) -> String {
        servers.map(\.description).joined(separator: ",")
    }

    public init(parsing text: String) throws(UsageError) {
        var host = Substring(text)
        var port = Self.defaultPort
        if host.hasPrefix("[") {
            // [v6] or [v6]:port
            guard let close = host.firstIndex(of: "]") else { throw UsageError("--server: missing ']' in '\(text)'") }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":") else { throw UsageError("--server expects HOST:PORT, got '\(text)'") }
                port = try Self.port(rest.dropFirst(), in: text)
            }
        } else if let colon = host.lastIndex(of: ":") {
            guard host.firstIndex(of: ":") == colon else {
                throw UsageError("--server: write an IPv6 address in brackets, e.g. [::1]:7443, got '\(text)'")
            }
            port = try Self.port(host[host.index(after: colon)...], in: text)
            host = host[..<colon]
        }
        guard !host.isEmpty else { throw UsageError("--server: the host is empty in '\(text)'") }
        guard !host.contains(where: { $0.isWhitespace || $0 == "/" }) else {
            throw UsageError("--server expects HOST:PORT, got '\(text)'")
        }
        self.init(host: String(host), port: port)
    }

    private static func port(_ text: Substring, in whole: String) throws(UsageError) -> UInt16 {
        guard let value = UInt16(text), value != 0 else {
            throw UsageError("--server: the port must be 1-65535, got '\(text)' in '\(whole)'")
        }
        return value
    }
}
