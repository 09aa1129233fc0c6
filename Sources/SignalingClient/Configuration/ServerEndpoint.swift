/// One server the client may connect to: a host (a numeric IPv4/IPv6 address or a name,
/// which may resolve to several addresses) and a port. `ClientConfiguration.servers`
/// lists them in the order of preference (docs/CLIENT.md, "Several servers").
public struct ServerEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    /// The name this server's TLS certificate is checked against (and sent as SNI), when
    /// it is not the one of `ClientConfiguration.tls` (`serverName`) or, without that, the
    /// host dialled. See `tlsName(under:)`.
    public var tlsServerName: String?

    public init(host: String, port: UInt16, tlsServerName: String? = nil) {
        self.host = host
        self.port = port
        self.tlsServerName = tlsServerName
    }

    /// The name checked against this server's certificate: the endpoint's own
    /// `tlsServerName`, else the configuration's `serverName` (one certificate for the
    /// whole service, e.g. nodes dialled by address), else the host dialled (each node has a
    /// certificate for its own name).
    public func tlsName(under tls: ClientTLSConfiguration) -> String {
        tlsServerName ?? tls.checkedName(dialling: host)
    }

    /// "host:port", with an IPv6 literal in brackets.
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Turns a host and port into socket addresses, in the order to try them (getaddrinfo's
/// order by default). Called on the connect attempt's thread, so it may block; tests inject
/// one that answers a made-up name with several loopback addresses.
public typealias HostResolver = @Sendable (_ host: String, _ port: UInt16) throws(ConnectError) -> [SocketAddress]
