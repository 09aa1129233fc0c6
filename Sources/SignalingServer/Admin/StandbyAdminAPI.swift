import SignalingProtocol
import SignalingSupport

/// The admin API of a node that does not hold the store lease (docs/CLUSTER.md,
/// docs/ADMIN-API.md): a standby, or a front of a cluster. It is alive (`/healthz` 200);
/// a standby must receive no devices (`/readyz` 503 with the reason), a front may while
/// it can relay them to the home (`/readyz` 200, else 503 with the reason); `/metrics`
/// says its role. The backend calls answer 503: only the active node (the home) holds
/// the state they act on.
final class StandbyAdminAPI: AdminRequestHandler {
    enum Role: String {
        case standby, front
    }

    private let token: [UInt8]?
    private let role: Role
    /// Whether this node takes devices now, and why not.
    private let readiness: @Sendable () -> Readiness
    /// A front's open device connections (nil: a standby, which has none).
    private let frontConnections: (@Sendable () -> Int)?
    /// A front's own families (`SignalingServer.frontMetrics`: what it relays, its
    /// listeners' sockets and TLS); writes nothing between its front terms.
    private let frontMetrics: (@Sendable (inout PrometheusText) -> Void)?

    init(
        token: String?, role: Role = .standby, readiness: @escaping @Sendable () -> Readiness,
        frontConnections: (@Sendable () -> Int)? = nil, frontMetrics: (@Sendable (inout PrometheusText) -> Void)? = nil
    ) {
        self.token = token.map { Array($0.utf8) }
        self.role = role
        self.readiness = readiness
        self.frontConnections = frontConnections
        self.frontMetrics = frontMetrics
    }

    /// A standby's: never ready, for `reason` (who holds the lease, or that the store
    /// cannot be reached).
    convenience init(token: String?, reason: @escaping @Sendable () -> String) {
        self.init(token: token, role: .standby) { Readiness(standby: reason()) }
    }

    func handle(_ request: AdminRequest, respond: @escaping @Sendable (AdminResponse) -> Void) {
        let readiness = readiness()
        switch request.path {
        case "/healthz": return respond(AdminAPI.allowing(request, [.get, .head]) ?? .text(200, "ok\n"))
        case "/readyz": return respond(AdminAPI.allowing(request, [.get, .head]) ?? AdminAPI.ready(readiness))
        default: break
        }
        if let refusal = AdminAPI.authenticate(request, token: token) { return respond(refusal) }
        guard request.path == "/metrics" else {
            return respond(AdminAPI.error(
                503, role.rawValue, "this node is a \(role.rawValue) (\(readiness.reasons.joined(separator: "; "))); the active node serves the API"))
        }
        var out = PrometheusText()
        out.family("voipserver_build_info", .gauge, "Always 1; the labels say which build runs.")
        out.sample("voipserver_build_info", ["version": ProductVersion.current, "protocol": String(ProtocolLimits.version)], 1)
        out.family("voipserver_ready", .gauge, "1 when /readyz answers 200: listening, not draining, store healthy.")
        out.sample("voipserver_ready", [:], readiness.isReady ? 1 : 0)
        AdminAPI.role(role.rawValue, into: &out)
        if let frontConnections {
            out.family("voipserver_front_connections", .gauge, "Device connections a front holds open and relays to the home (or is accepting).")
            out.sample("voipserver_front_connections", [:], frontConnections())
        }
        frontMetrics?(&out)
        respond(AdminAPI.allowing(request, [.get, .head])
            ?? AdminResponse(status: 200, contentType: PrometheusText.contentType, body: Array(out.text.utf8)))
    }
}
