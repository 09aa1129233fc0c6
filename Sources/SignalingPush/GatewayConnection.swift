import CLibevent
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
    /// The request on the wire, or nil. Cleared before anything that could call back for
    /// it (completion, cancel), so a late callback for it is recognised and ignored.
    private(set) var request: OpaquePointer?
    private(set) var attempt: WakeUpScheduler.Attempt?
    /// Real (not injected) time by which the request must have completed.
    private(set) var deadline = Instant(nanoseconds: 0)
    /// What libevent reported through the error callback, for the log.
    var lastError: evhttp_request_error?

    init(loop: GatewayLoop, index: Int) {
        self.loop = loop
        self.index = index
    }

    var isBusy: Bool { request != nil }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Starts `attempt`. Returns false when libevent refused it at once (nothing was sent
    /// and no callback will come). Completion may also be reported before this returns:
    /// libevent calls back synchronously when a connect fails immediately.
    func start(_ attempt: WakeUpScheduler.Attempt, endpoint: GatewayEndpoint, address: String, timeout: Duration, now: Instant) -> Bool {
        guard let connection = openConnection(address: address, endpoint: endpoint, timeout: timeout) else { return false }
        guard let request = evhttp_request_new({ request, arg in
            Unmanaged<GatewayConnection>.fromOpaque(arg!).takeUnretainedValue().finished(request)
        }, unmanagedSelf) else { return false }
        evhttp_request_set_error_cb(request) { error, arg in
            Unmanaged<GatewayConnection>.fromOpaque(arg!).takeUnretainedValue().failed(error)
        }
        let headers = evhttp_request_get_output_headers(request)
        evhttp_add_header(headers, "Host", endpoint.hostHeader)
        evhttp_add_header(headers, "Content-Type", "application/json")
        evhttp_add_header(headers, "Content-Length", String(attempt.body.count))
        evhttp_add_header(headers, "User-Agent", "voipserver-push/1")
        attempt.body.withUnsafeBytes { bytes in
            _ = evbuffer_add(evhttp_request_get_output_buffer(request), bytes.baseAddress, bytes.count)
        }
        self.request = request
        self.attempt = attempt
        self.deadline = now + timeout
        self.lastError = nil
        if evhttp_make_request(connection, request, EVHTTP_REQ_POST, endpoint.path) != 0 {
            // libevent 2.1 removed it from the connection but may not have freed it: a
            // small leak on a path that needs a failing socket() is safer than a double free.
            self.request = nil
            self.attempt = nil
            return false
        }
        return true
    }

    /// Abandons the request on the wire: libevent frees it and resets the connection;
    /// the error callback it makes with EVREQ_HTTP_REQUEST_CANCEL is ignored. Returns the
    /// abandoned attempt.
    @discardableResult
    func cancel() -> WakeUpScheduler.Attempt? {
        guard let request else { return nil }
        let abandoned = attempt
        self.request = nil
        self.attempt = nil
        evhttp_cancel_request(request)
        return abandoned
    }

    /// Closes the socket and frees libevent's connection (and any request on it, with no
    /// callback). The loop calls this after leaving its event loop.
    func free() {
        request = nil
        attempt = nil
        if let connection { evhttp_connection_free(connection) }
        connection = nil
    }

    private func openConnection(address: String, endpoint: GatewayEndpoint, timeout: Duration) -> OpaquePointer? {
        if let connection { return connection }
        guard let created = evhttp_connection_base_new(loop.base, nil, address, endpoint.port) else { return nil }
        var tv = GatewayLoop.timeval(timeout)
        evhttp_connection_set_timeout_tv(created, &tv)
        // Retries are the scheduler's job (with back-off), never libevent's.
        evhttp_connection_set_retries(created, 0)
        // A wake-up's answer is a status line; anything big is a misbehaving gateway.
        evhttp_connection_set_max_headers_size(created, 16 * 1024)
        evhttp_connection_set_max_body_size(created, 64 * 1024)
        connection = created
        return created
    }

    private func failed(_ error: evhttp_request_error) {
        guard request != nil else { return }  // cancelled by us
        lastError = error
    }

    private func finished(_ response: OpaquePointer?) {
        guard request != nil, let attempt else { return }  // cancelled by us
        request = nil
        self.attempt = nil
        let status = response.map { Int(evhttp_request_get_response_code($0)) } ?? 0
        var retryAfter: String?
        if let response, status == 429 || status == 503,
           let value = evhttp_find_header(evhttp_request_get_input_headers(response), "Retry-After") {
            retryAfter = String(cString: value)
        }
        loop.completed(attempt, on: self, status: status, retryAfter: retryAfter, error: lastError)
    }
}
