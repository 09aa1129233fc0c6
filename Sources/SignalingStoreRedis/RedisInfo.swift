import SignalingStore

/// Redis's INFO, for benchmarks and operators' tools: what the store's work cost Redis
/// (commands, bytes received, AOF growth).
public enum RedisInfo {
    /// The `name:value` lines of INFO `section` (`commandstats`, `stats`, `persistence`...).
    public static func read(_ endpoint: RedisEndpoint, section: String) throws(StoreError) -> [String: String] {
        let connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: 5_000)
        guard let text = try connection.run(RedisCommand("INFO", section)).text else {
            throw StoreError(.other, "INFO \(section) did not answer with text")
        }
        var values: [String: String] = [:]
        for line in text.split(whereSeparator: \.isNewline) where !line.hasPrefix("#") {
            guard let colon = line.firstIndex(of: ":") else { continue }
            values[String(line[..<colon])] = String(line[line.index(after: colon)...])
        }
        return values
    }

    /// One setting, from CONFIG GET.
    public static func config(_ endpoint: RedisEndpoint, _ name: String) throws(StoreError) -> String {
        let connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: 5_000)
        guard case .array(let pair) = try connection.run(RedisCommand("CONFIG", "GET", name)), pair.count == 2, let value = pair[1].text else {
            throw StoreError(.other, "CONFIG GET \(name) did not answer with its value")
        }
        return value
    }

    /// Calls per command (`cmdstat_zadd:calls=12,...`), from INFO commandstats.
    public static func commandCalls(_ endpoint: RedisEndpoint) throws(StoreError) -> [String: Int] {
        var calls: [String: Int] = [:]
        for (name, value) in try read(endpoint, section: "commandstats") where name.hasPrefix("cmdstat_") {
            let field = value.split(separator: ",").first { $0.hasPrefix("calls=") }
            calls[String(name.dropFirst("cmdstat_".count))] = field.flatMap { Int($0.dropFirst("calls=".count)) } ?? 0
        }
        return calls
    }
}
