import SignalingSupport

/// Where the admin HTTP API listens and who may use it (docs/ADMIN-API.md).
public struct AdminConfiguration: Sendable, Equatable {
    /// A literal IPv4 or IPv6 address.
    public var host: String
    public var port: UInt16
    /// Requests must carry `Authorization: Bearer <token>` (except the health probes).
    /// Nil: no authentication, which is only allowed on a loopback address.
    public var token: String?
    /// Largest request body accepted.
    public var maxBodyBytes = 1 << 20

    public init(host: String = "127.0.0.1", port: UInt16, token: String? = nil) {
        self.host = host
        self.port = port
        self.token = token
    }

    /// 127.0.0.0/8 or ::1: only processes on this host can connect.
    public var isLoopback: Bool { ServerConfiguration.isLoopback(host) }

    public func validate() throws(UsageError) {
        if token == nil && !isLoopback {
            throw UsageError(
                "--admin-listen \(host): the admin API without --admin-token-file may only listen on a loopback address (127.0.0.1 or ::1)")
        }
        if let token, token.isEmpty { throw UsageError("--admin-token-file: the token is empty") }
    }
}
