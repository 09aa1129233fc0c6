import SignalingStore

/// Where the Redis store lives: `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`.
///
/// The password may contain any byte as `%XX` (an `@`, `:` or `/` must be written so).
/// A password on the command line is visible to every local user in `ps`: put the
/// `store = redis://...` line in the `--config` file instead (docs/CONFIGURATION.md).
public struct RedisEndpoint: Sendable, Equatable {
    public var host: String
    public var port: Int
    /// Redis 6 ACL user; nil: the default user (`AUTH PASSWORD`).
    public var username: String?
    public var password: String?
    /// The logical database (`SELECT`), 0 by default.
    public var database: Int

    public static let defaultPort = 6379

    public init(host: String, port: Int = RedisEndpoint.defaultPort, username: String? = nil, password: String? = nil, database: Int = 0) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
    }

    /// `host:port`, for messages and logs (never the password).
    public var address: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// The URL without its password, for logs.
    public var redacted: String {
        let credentials = password == nil ? "" : "\(username ?? ""):***@"
        return "redis://\(credentials)\(address)/\(database)"
    }

    /// Parses the URL; throws `.other` with what is wrong with it.
    public init(url: String) throws(StoreError) {
        func invalid(_ why: String) -> StoreError {
            StoreError(.other, "'\(Self.redactingPassword(url))' is not a Redis URL (redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]): \(why)")
        }
        guard url.hasPrefix("redis://") else { throw invalid("it must start with redis://") }
        var rest = Substring(url.dropFirst("redis://".count))
        var databaseText: Substring?
        if let slash = rest.firstIndex(of: "/") {
            databaseText = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }
        var username: String?, password: String?
        if let at = rest.lastIndex(of: "@") {
            let credentials = rest[..<at]
            rest = rest[rest.index(after: at)...]
            guard let colon = credentials.firstIndex(of: ":") else { throw invalid("credentials are USER:PASSWORD or :PASSWORD") }
            guard let user = Self.percentDecoded(credentials[..<colon]),
                  let secret = Self.percentDecoded(credentials[credentials.index(after: colon)...])
            else { throw invalid("a bad %-escape in the credentials") }
            username = user.isEmpty ? nil : user
            password = secret
        }
        var host = rest, portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw invalid("an IPv6 address needs its closing ]") }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw invalid("unexpected text after the address") }
                portText = after.dropFirst()
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            portText = rest[rest.index(after: colon)...]
        }
        guard !host.isEmpty else { throw invalid("no host") }
        var port = Self.defaultPort
        if let portText {
            guard let parsed = Int(portText), (1...65_535).contains(parsed) else { throw invalid("the port must be 1-65535") }
            port = parsed
        }
        var database = 0
        if let databaseText, !databaseText.isEmpty {
            guard let parsed = Int(databaseText), parsed >= 0 else { throw invalid("the database must be a number") }
            database = parsed
        }
        self.init(host: String(host), port: port, username: username, password: password, database: database)
    }

    /// Parses `redis://A,redis://B,...` (the store's instances, `RedisStoreConfiguration.endpoints`):
    /// at least one URL, no two naming the same database. A `,` in a password is written `%2C`.
    public static func list(_ urls: String) throws(StoreError) -> [RedisEndpoint] {
        var endpoints: [RedisEndpoint] = []
        for url in urls.split(separator: ",", omittingEmptySubsequences: false) {
            let endpoint = try RedisEndpoint(url: url.trimmingSpaces)
            guard !endpoints.contains(where: { $0.address == endpoint.address && $0.database == endpoint.database }) else {
                throw StoreError(.other, "\(endpoint.redacted) is in the list of Redis instances twice")
            }
            endpoints.append(endpoint)
        }
        return endpoints
    }

    private static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = iterator.next(), let low = iterator.next(),
                  let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16)
            else { return nil }
            bytes.append(value)
        }
        return String(validating: bytes, as: UTF8.self)
    }

    /// The URL with any password replaced, for error messages about a URL that did not parse.
    static func redactingPassword(_ url: String) -> String {
        let scheme = "redis://"
        guard url.hasPrefix(scheme), let at = url.lastIndex(of: "@") else { return url }
        let start = url.index(url.startIndex, offsetBy: scheme.count)
        guard start <= at, let colon = url[start..<at].firstIndex(of: ":") else { return url }
        return String(url[...colon]) + "***" + String(url[at...])
    }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}
