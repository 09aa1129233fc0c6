import SignalingProtocol

/// Everything that tunes a client. Every field has a production default except the
/// servers and the identity.
public struct ClientConfiguration: Sendable {
    /// The servers, in the order of preference (at least one). Each attempt tries them
    /// from the one that last worked on, each name's addresses in turn, and moves on when
    /// one fails; when all failed it backs off (docs/CLIENT.md, "Several servers").
    public var servers: [ServerEndpoint]
    /// The first server's host: a numeric IPv4/IPv6 address or a host name ("" when the
    /// list is empty). Setting it changes the first server only (adding one to an empty list).
    public var host: String {
        get { servers.first?.host ?? "" }
        set { if servers.isEmpty { servers = [ServerEndpoint(host: newValue, port: 0)] } else { servers[0].host = newValue } }
    }
    /// The first server's port (0 when the list is empty). Setting it changes the first
    /// server only (adding one to an empty list).
    public var port: UInt16 {
        get { servers.first?.port ?? 0 }
        set { if servers.isEmpty { servers = [ServerEndpoint(host: "", port: newValue)] } else { servers[0].port = newValue } }
    }
    /// Turns each server's host into addresses; getaddrinfo (`SocketAddress.resolve`) by
    /// default. Runs on the connect attempt's thread and may block.
    public var resolver: HostResolver = { (host, port) throws(ConnectError) in try SocketAddress.resolve(host: host, port: port) }
    public var userID: String
    public var deviceID: String
    /// HELLO credentials: a device token (docs/AUTH.md), minted by the app's backend.
    public var credentials: [UInt8]?
    /// Where fresh credentials come from when the server refuses the current ones with
    /// action `refreshCredentials` (CLOSE `tokenExpired` or `unknownKey`): the refusal is
    /// passed in, the new token comes back (nil: none now). Called on the connect
    /// attempt's own thread, before it connects, so it may block (ask the app's backend);
    /// the attempt's `connectTimeout` runs meanwhile. The client never stops for good
    /// over such a refusal: without a provider, or while it returns nil, it retries with
    /// back-off. See docs/CLIENT.md, "Credentials".
    public var credentialsProvider: (@Sendable (Close) -> [UInt8]?)?
    /// TLS to the server (CA, name check, pins); nil: plain TCP, for loopback or behind a
    /// TLS-terminating load balancer. See docs/CLIENT.md, "TLS".
    public var tls: ClientTLSConfiguration?
    /// Keep-alive interval to ask the server for, in seconds; 0 = the server's choice.
    /// 1...599 is refused by `init` (the server would refuse it too).
    public var requestedKeepAliveSeconds: UInt32 = 0
    /// Deadline of an automatic connect-then-mark attempt (TCP connect plus handshake);
    /// the protocol's checklist uses 10 s.
    public var connectTimeout: Duration = .seconds(10)
    /// A PING unanswered this long means the connection is dead (the iOS handler budget).
    public var pongTimeout: Duration = .seconds(10)
    /// The budget of one keep-alive handler run; after it the run has expired.
    public var keepAliveHandlerBudget: Duration = .seconds(10)
    public var reconnect = ReconnectPolicy()
    public var socketOptions = VoIPSocketOptions()
    public var backgroundExecution = BackgroundExecutionPolicy()
    /// Pending local notifications kept at most (128, as in the article).
    public var notificationCapacity = LocalNotificationCenter.defaultCapacity
    /// Post a local notification for each incoming call and message that arrives while
    /// the app is not in the foreground.
    public var notifiesWhenNotInForeground = true
    /// Watch the system's network state (netlink on Linux, NWPathMonitor on Apple
    /// platforms) and reconnect when the socket's path goes away or a better one appears.
    public var watchesNetwork = true
    /// A durable request (message, push registration) refused with a retryable error is
    /// sent again after this delay, doubling per refusal up to 16 times this.
    public var requestRetryDelay: Duration = .seconds(2)
    /// The longest the client's timer sleeps before reading its clock again. nil (the
    /// default) sleeps exactly until the next deadline, which is right for the system
    /// clock; tests that drive a `ManualClock` set a few milliseconds.
    public var maximumTimerWait: Duration?

    /// One server: the list `[ServerEndpoint(host:port:)]`.
    public init(host: String, port: UInt16, userID: String, deviceID: String, credentials: [UInt8]? = nil) {
        self.init(servers: [ServerEndpoint(host: host, port: port)], userID: userID, deviceID: deviceID, credentials: credentials)
    }

    /// Several servers, tried in this order (the first that works is kept, sticky).
    public init(servers: [ServerEndpoint], userID: String, deviceID: String, credentials: [UInt8]? = nil) {
        self.servers = servers
        self.userID = userID
        self.deviceID = deviceID
        self.credentials = credentials
    }

    /// Checks every field; the error names the first bad one.
    public func validate() throws(ClientConfigurationError) {
        guard !servers.isEmpty else { throw .invalid("servers is empty") }
        for (index, server) in servers.enumerated() {
            let name = servers.count == 1 ? "" : "servers[\(index)]: "
            guard !server.host.isEmpty else { throw .invalid("\(name)host is empty") }
            guard server.port != 0 else { throw .invalid("\(name)port must not be 0") }
            if let serverName = server.tlsServerName, serverName.isEmpty { throw .invalid("\(name)tlsServerName is empty") }
        }
        // The reference codec decides what a valid HELLO is: encode one and read it back.
        let hello = Frame.hello(Hello(userID: userID, deviceID: deviceID, credentials: credentials,
                                      requestedKeepAliveSeconds: requestedKeepAliveSeconds))
        if case .failure(let violation) = FrameDecoder().decode(array: FrameEncoder.encode(hello)) {
            throw .invalid("identity: \(violation.message)")
        }
        if let credentials, credentials.count > ProtocolLimits.maxTokenBytes {
            throw .invalid("credentials are \(credentials.count) bytes, the limit is \(ProtocolLimits.maxTokenBytes)")
        }
        if requestedKeepAliveSeconds != 0 && requestedKeepAliveSeconds < ProtocolLimits.minimumKeepAliveSeconds {
            throw .invalid("requested keep-alive \(requestedKeepAliveSeconds) s is under the 600 s minimum")
        }
        for (name, value) in [("connectTimeout", connectTimeout), ("pongTimeout", pongTimeout),
                              ("keepAliveHandlerBudget", keepAliveHandlerBudget), ("requestRetryDelay", requestRetryDelay),
                              ("reconnect.initialDelay", reconnect.initialDelay),
                              ("reconnect.certificateFailureDelay", reconnect.certificateFailureDelay),
                              ("backgroundExecution.wakeSlice", backgroundExecution.wakeSlice),
                              ("backgroundExecution.taskAllowance", backgroundExecution.taskAllowance)] where value <= .zero {
            throw .invalid("\(name) must be positive")
        }
        guard reconnect.maximumDelay >= reconnect.initialDelay else { throw .invalid("reconnect.maximumDelay is below initialDelay") }
        guard backgroundExecution.expirationWarning >= .zero,
              backgroundExecution.expirationWarning < backgroundExecution.taskAllowance
        else { throw .invalid("backgroundExecution.expirationWarning must be within the task allowance") }
        guard notificationCapacity >= 1 else { throw .invalid("notificationCapacity must be at least 1") }
        if let wait = maximumTimerWait, wait <= .zero { throw .invalid("maximumTimerWait must be positive") }
        if let tls, let serverName = tls.serverName, serverName.isEmpty { throw .invalid("tls.serverName is empty") }
    }
}

/// A configuration the client cannot work with.
public enum ClientConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    case invalid(String)
    public var description: String {
        switch self { case .invalid(let message): return "invalid client configuration: \(message)" }
    }
}
