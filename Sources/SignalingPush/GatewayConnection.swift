import CLibeventShims
import SignalingSupport

/// One keep-alive HTTP connection to the gateway, carrying at most one request at a time.
/// libevent's callbacks get this object as their argument; it lives (in
/// `GatewayLoop.connections`) until the loop has freed every libevent connection, so the
/// pointer never dangles. Confined to the gateway's thread.
final class GatewayConnection {
    unowned let loop: GatewayLoop
    let index: Int
    /// Created at the first request; libevent reconnects it by itself after a close.
    private var connection: OpaquePointer?
    /// The attempt on the wire, or nil. Cleared before anything that could call back for
    /// it (completion, cancel), so a late callback is recognised and ignored.
    private(set) var attempt: WakeUpScheduler.Attempt?
    /// libevent's request for `attempt`, for cancelling it (nil until `start` returns).
    private var request: OpaquePointer?
    /// Real (not injected) time by which the request must have completed.
    private(set) var deadline = Instant(nanoseconds: 0)
    /// What libevent reported through the error callback (VS_HTTP_ERROR_*), for the log.
    private var lastError: Int32?

    init(loop: GatewayLoop, index: Int) {
        self.loop = loop
        self.index = index
    }

    var isBusy: Bool { attempt != nil }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Starts `attempt`. Returns false when libevent refused it at once (nothing was sent
    /// and no callback will come). Completion may be reported before this returns:
    /// libevent calls back synchronously when a connect fails immediately.
    func start(_ attempt: WakeUpScheduler.Attempt, endpoint: GatewayEndpoint, address: String, timeout: Duration, now: Instant) -> Bool {
        guard case .webhook = attempt.request else { return false }
        guard let connection = openConnection(address: address, port: endpoint.port, timeout: timeout) else { return false }
        self.attempt = attempt
        deadline = now + timeout
        lastError = nil
        var started: OpaquePointer?
        guard case .webhook(let payload) = attempt.request else { return false }
        let rc = payload.withUnsafeBytes { body in
            vs_http_post(
                connection, endpoint.path, endpoint.hostHeader, "application/json", "voipserver-push/1",
                body.baseAddress, body.count,
                { response, argument in
                    Unmanaged<GatewayConnection>.fromOpaque(argument!).takeUnretainedValue().finished(response)
                },
                { error, argument in
                    Unmanaged<GatewayConnection>.fromOpaque(argument!).takeUnretainedValue().failed(error)
                },
                unmanagedSelf, &started)
        }
        guard rc == 0 else {
            self.attempt = nil
            return false
        }
        // Still busy: keep the request for a cancel. Otherwise it has already completed
        // and libevent has freed it.
        if isBusy { request = started }
        return true
    }

    /// Abandons the request on the wire: libevent frees it and resets the connection.
    /// Returns the abandoned attempt.
    @discardableResult
    func cancel() -> WakeUpScheduler.Attempt? {
        guard let abandoned = attempt else { return nil }
        let pending = request
        attempt = nil
        request = nil
        // Its error callback (cancelled) runs synchronously and is ignored: `attempt` is nil.
        if let pending { vs_http_cancel(pending) }
        return abandoned
    }

    /// Closes the socket and frees libevent's connection (and any request on it, with no
    /// callback). The loop calls this after leaving its event loop.
    func free() {
        attempt = nil
        request = nil
        if let connection { vs_http_connection_free(connection) }
        connection = nil
    }

    private func openConnection(address: String, port: UInt16, timeout: Duration) -> OpaquePointer? {
        if let connection { return connection }
        // Retries are the scheduler's job (with back-off), never libevent's. A wake-up's
        // answer is a status line: anything big is a misbehaving gateway.
        connection = vs_http_connection_new(
            loop.base, address, port, max(1, timeout.microseconds), Self.maxHeaderBytes, Self.maxBodyBytes)
        return connection
    }

    static let maxHeaderBytes: Int64 = 16 * 1024
    static let maxBodyBytes: Int64 = 64 * 1024

    private func failed(_ error: Int32) {
        guard isBusy else { return }  // cancelled by us
        lastError = error
    }

    private func finished(_ response: OpaquePointer?) {
        guard let attempt else { return }  // cancelled by us
        self.attempt = nil
        request = nil
        let status = response.map { Int(vs_http_response_code($0)) } ?? 0
        var retryAfter: String?
        if let response, status == 429 || status == 503, let value = vs_http_response_header(response, "Retry-After") {
            retryAfter = String(cString: value)
        }
        loop.completed(attempt, on: self, status: status, retryAfter: retryAfter, error: lastError)
    }
}
