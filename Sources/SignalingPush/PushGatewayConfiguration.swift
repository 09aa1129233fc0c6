import SignalingSupport

/// Where and how wake-ups are sent. Defaults suit production; see docs/PUSH.md. At least
/// one service is configured: the webhook gateway, APNs or FCM.
public struct PushGatewayConfiguration: Sendable {
    /// The webhook gateway's endpoint (`http://host:port/path`; plain HTTP only), if any.
    public var endpoint: GatewayEndpoint?
    /// Apple's push service, spoken to directly.
    public var apns: APNsConfiguration?
    /// Firebase Cloud Messaging, spoken to directly.
    public var fcm: FCMConfiguration?
    /// A PEM file of CAs trusted for APNs, FCM and the token endpoint instead of the
    /// system's (tests; a TLS-inspecting proxy). Nil: the system's store.
    public var caFile: String?
    /// How long a call's wake-up stays worth delivering: the ring timeout. A call push is
    /// never sent later than this after the call started, and tells APNs (apns-expiration)
    /// and FCM (ttl) to give up by then too: a stale ring must never arrive.
    public var callLifetime: Duration = .seconds(60)
    /// Requests in flight at once on the one HTTP/2 connection to each of APNs and FCM
    /// (the service's SETTINGS may lower it).
    /// 100 rather than APNs' 1000: libcurl's CPU per request grows with the transfers
    /// in flight (docs/PUSH.md, "Benchmark").
    public var maxConcurrentStreams = 100
    /// A request that has not completed in this long fails and is retried. libevent
    /// applies it to connecting and to every wait for the gateway to read or answer.
    public var requestTimeout: Duration = .seconds(5)
    /// Largest JSON body sent. A wake-up whose body would be larger is not sent (counted).
    /// The default is APNs' payload limit.
    public var maxBodyBytes = 4096
    /// Smallest time between the starts of two wake-ups for one device. Events in between
    /// are coalesced into the next wake-up. A call following a lesser kind is exempt.
    public var minimumInterval: Duration = .seconds(10)
    /// Retry back-off: the n-th retry waits a random time between `minimumBackoff` and
    /// min(`maximumBackoff`, `minimumBackoff` × 2^(n-1)) (exponential, full jitter).
    public var minimumBackoff: Duration = .seconds(1)
    public var maximumBackoff: Duration = .seconds(300)
    /// A wake-up is given up (counted as dropped) after this many failed attempts...
    public var maxAttempts = 8
    /// ...or when its next attempt would start later than this after it was queued.
    public var maxAge: Duration = .seconds(900)
    /// Requests in flight at once (one connection each, kept alive between requests).
    public var maxConcurrentRequests = 8
    /// Devices with a wake-up waiting, in flight, or inside their minimum interval. A
    /// wake-up for a new device beyond this is dropped (counted). Bounds memory.
    public var maxQueuedDevices = 100_000
    /// How often the gateway's loop looks at its clock for due retries and deferred
    /// wake-ups. New wake-ups are sent at once; this only bounds how late timers fire.
    public var tickInterval: Duration = .milliseconds(100)

    public init(endpoint: GatewayEndpoint?) {
        self.endpoint = endpoint
    }

    /// No service yet: set `endpoint`, `apns` or `fcm`.
    public init() {}

    /// The services configured.
    public var routing: PushRouting {
        var services: Set<PushService> = []
        if endpoint != nil { services.insert(.webhook) }
        if apns != nil { services.insert(.apns) }
        if fcm != nil { services.insert(.fcm) }
        return PushRouting(services: services)
    }

    /// Parses `url` (`http://host[:port]/path`) and keeps every other default.
    public init(url: String) throws(UsageError) {
        self.init(endpoint: try GatewayEndpoint(url: url))
    }

    /// Checks relations between fields.
    public func validate() throws(UsageError) {
        guard endpoint != nil || apns != nil || fcm != nil else {
            throw UsageError("no push service: give a webhook gateway, APNs or FCM")
        }
        try apns?.validate()
        try fcm?.validate()
        guard callLifetime >= .seconds(1) else { throw UsageError("push call lifetime must be at least 1 s") }
        guard (1...10_000).contains(maxConcurrentStreams) else { throw UsageError("push concurrent streams must be between 1 and 10000") }
        guard requestTimeout >= .milliseconds(1) else { throw UsageError("push request timeout must be at least 1 ms") }
        guard maxBodyBytes >= 64 else { throw UsageError("push body cap must be at least 64 bytes") }
        guard minimumInterval >= .zero else { throw UsageError("push minimum interval must not be negative") }
        guard minimumBackoff > .zero, maximumBackoff >= minimumBackoff else {
            throw UsageError("push back-off must satisfy 0 < minimum <= maximum")
        }
        guard maxAttempts >= 1 else { throw UsageError("push max attempts must be at least 1") }
        guard maxAge > .zero else { throw UsageError("push max age must be positive") }
        guard (1...1024).contains(maxConcurrentRequests) else {
            throw UsageError("push concurrent requests must be between 1 and 1024")
        }
        guard maxQueuedDevices >= 1 else { throw UsageError("push queued devices must be at least 1") }
        guard tickInterval >= .milliseconds(1), tickInterval <= .seconds(1) else {
            throw UsageError("push tick must be between 1 ms and 1 s")
        }
    }
}

/// A parsed `http://host[:port]/path` gateway URL.
///
/// HTTPS is not supported: libevent's HTTP client speaks plain HTTP here. To reach a
/// gateway over TLS, run a TLS-terminating relay (stunnel, nginx, envoy) next to the
/// server and point this URL at it on loopback or a private network.
public struct GatewayEndpoint: Sendable, Equatable, CustomStringConvertible {
    /// Host name or IP literal (IPv6 without brackets).
    public var host: String
    public var port: UInt16
    /// Path and query sent in the request line; starts with "/".
    public var path: String

    public init(host: String, port: UInt16, path: String) {
        self.host = host
        self.port = port
        self.path = path
    }

    public init(url: String) throws(UsageError) {
        let lowered = url.lowercased()
        if lowered.hasPrefix("https://") {
            throw UsageError("push gateway '\(url)': https is not supported; put a TLS-terminating relay in front of the gateway and give its http:// address")
        }
        guard lowered.hasPrefix("http://") else {
            throw UsageError("push gateway '\(url)' must be an http://host[:port]/path URL")
        }
        let rest = url.dropFirst("http://".count)
        let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
        let authority = rest[..<slash]
        var path = String(rest[slash...])
        if path.isEmpty { path = "/" } else if path.first == "?" { path = "/" + path }
        if let hash = path.firstIndex(of: "#") { path = String(path[..<hash]) }
        guard !authority.contains("@") else { throw UsageError("push gateway '\(url)': credentials in the URL are not supported") }
        guard path.allSatisfy({ $0.isASCII && !$0.isWhitespace }) else {
            throw UsageError("push gateway '\(url)': the path must be ASCII without spaces (percent-encode it)")
        }

        var host: Substring
        var portText: Substring?
        if authority.first == "[" {
            guard let close = authority.firstIndex(of: "]") else { throw UsageError("push gateway '\(url)': unclosed IPv6 bracket") }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.first == ":" else { throw UsageError("push gateway '\(url)': unexpected text after the IPv6 address") }
                portText = after.dropFirst()
            }
        } else if let colon = authority.lastIndex(of: ":") {
            host = authority[..<colon]
            portText = authority[authority.index(after: colon)...]
        } else {
            host = authority
        }
        guard !host.isEmpty else { throw UsageError("push gateway '\(url)' has no host") }
        var port: UInt16 = 80
        if let portText {
            guard let value = UInt16(portText), value > 0 else { throw UsageError("push gateway '\(url)': bad port '\(portText)'") }
            port = value
        }
        self.init(host: String(host), port: port, path: path)
    }

    /// The Host header value: the host as written, with the port unless it is 80.
    var hostHeader: String {
        let shown = host.contains(":") ? "[\(host)]" : host
        return port == 80 ? shown : "\(shown):\(port)"
    }

    public var description: String { "http://\(hostHeader)\(path)" }
}
