import SignalingProtocol
import SignalingSupport

/// The admin API of a standby node (docs/CLUSTER.md, docs/ADMIN-API.md): it is alive
/// (`/healthz` 200) but must receive no devices (`/readyz` 503 with the reason), and
/// `/metrics` says its role. The backend calls answer 503: only the active node holds
/// the state they act on.
final class StandbyAdminAPI: AdminRequestHandler {
    private let token: [UInt8]?
    /// Why this node waits (who holds the lease, or that the store cannot be reached).
    private let reason: @Sendable () -> String

    init(token: String?, reason: @escaping @Sendable () -> String) {
        self.token = token.map { Array($0.utf8) }
        self.reason = reason
    }

    func handle(_ request: AdminRequest, respond: @escaping @Sendable (AdminResponse) -> Void) {
        let readiness = Readiness(standby: reason())
        switch request.path {
        case "/healthz": return respond(AdminAPI.allowing(request, [.get, .head]) ?? .text(200, "ok\n"))
        case "/readyz": return respond(AdminAPI.allowing(request, [.get, .head]) ?? AdminAPI.ready(readiness))
        default: break
        }
        if let refusal = AdminAPI.authenticate(request, token: token) { return respond(refusal) }
        guard request.path == "/metrics" else {
            return respond(AdminAPI.error(503, "standby", "this node is a standby (\(readiness.standby ?? "")); the active node serves the API"))
        }
        var out = PrometheusText()
        out.family("voipserver_build_info", .gauge, "Always 1; the labels say which build runs.")
        out.sample("voipserver_build_info", ["version": ProductVersion.current, "protocol": String(ProtocolLimits.version)], 1)
        out.family("voipserver_ready", .gauge, "1 when /readyz answers 200: listening, not draining, store healthy.")
        out.sample("voipserver_ready", [:], 0)
        AdminAPI.role("standby", into: &out)
        respond(AdminAPI.allowing(request, [.get, .head])
            ?? AdminResponse(status: 200, contentType: PrometheusText.contentType, body: Array(out.text.utf8)))
    }
}
