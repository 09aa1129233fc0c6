#if canImport(Glibc)
import Glibc
#endif
import CCurlShims
import CLibeventShims
import SignalingSupport

/// HTTP/2 POSTs through libcurl's multi-socket interface, driven by the push loop's
/// libevent `event_base`: curl says which sockets to watch and when its timer is due;
/// libevent says when they are ready. One connection per host (`CURLMOPT_MAX_HOST_CONNECTIONS`
/// 1), every request a stream on it (`CURLPIPE_MULTIPLEX`, `CURLOPT_PIPEWAIT`); curl
/// reconnects when a connection is lost and handles GOAWAY (new streams go to a new
/// connection, those in flight up to its last-stream-id finish, and those above it are
/// sent again on the new one: by curl, or here for the one curl fails instead).
///
/// Confined to the push loop's thread. Costs one libevent event per socket curl watches
/// (one per connection) plus one timer, and one dictionary entry per request in flight.
final class HTTP2Client {
    /// What came back: a status (0 when the transfer failed before one arrived), the
    /// response headers the providers read, and the body (at most 64 KiB).
    struct Response {
        var status: Int
        var retryAfter: String?
        var apnsID: String?
        var body: [UInt8]
        /// curl's description of a failed transfer (nil when an answer arrived).
        var transportError: String?
        /// 2 for HTTP/2.
        var httpVersion: Int
        /// Connections this request had to open (0: it was a stream on an existing one).
        var newConnections: Int
    }

    typealias Completion = (Response) -> Void

    private let base: OpaquePointer
    private var multi: OpaquePointer?
    private let caFile: String?
    private var timer: OpaquePointer?
    /// libevent's event for each socket curl watches.
    private var sockets: [Int32: OpaquePointer] = [:]
    /// A request in flight: curl's handle, and what it takes to send it again once.
    private struct Pending {
        var request: OpaquePointer
        var url: String
        var headers: [String]
        var body: [UInt8]
        var timeout: Duration
        var completion: Completion
        /// Whether this is already the second try of a refused stream.
        var resent: Bool
    }

    /// Requests in flight by id (the id travels through curl as the request's user
    /// pointer). Each keeps its headers and body (a few hundred bytes) for one resend.
    private var pending: [Int: Pending] = [:]
    private var nextID = 1

    init(base: OpaquePointer, caFile: String?, maxStreams: Int) throws(PushGatewayError) {
        self.base = base
        self.caFile = caFile
        let argument = Unmanaged.passUnretained(self).toOpaque()
        guard let multi = vs_curl_multi_new(
            { fd, what, socketData, argument in
                Unmanaged<HTTP2Client>.fromOpaque(argument!).takeUnretainedValue().watch(fd, what)
            },
            { timeoutMS, argument in
                Unmanaged<HTTP2Client>.fromOpaque(argument!).takeUnretainedValue().setTimer(timeoutMS)
            },
            argument, 1, max(1, maxStreams))
        else { throw PushGatewayError("cannot create a libcurl multi handle") }
        self.multi = multi
        timer = vs_event_new(base, -1, 0, { _, _, argument in
            Unmanaged<HTTP2Client>.fromOpaque(argument!).takeUnretainedValue().timerFired()
        }, argument)
    }

    /// Requests in flight.
    var inFlight: Int { pending.count }

    /// Starts a POST. Returns false when curl refused it at once (no completion follows).
    /// The completion runs on the loop's thread, after curl's own callbacks have returned,
    /// so it may start new requests.
    func post(url: String, headers: [String], body: [UInt8], timeout: Duration, completion: @escaping Completion) -> Bool {
        start(url: url, headers: headers, body: body, timeout: timeout, completion: completion, resent: false)
    }

    private func start(url: String, headers: [String], body: [UInt8], timeout: Duration, completion: @escaping Completion, resent: Bool) -> Bool {
        guard let multi else { return false }
        let id = nextID
        nextID += 1
        let cHeaders = headers.map { strdup($0) }
        defer { for header in cHeaders { free(header) } }
        let request = cHeaders.map { UnsafePointer($0) }.withUnsafeBufferPointer { headerPointers in
            body.withUnsafeBufferPointer { bytes in
                vs_curl_request_new(
                    url, headerPointers.baseAddress, headerPointers.count, bytes.baseAddress, bytes.count,
                    Int(max(1, timeout.milliseconds)), caFile, UnsafeMutableRawPointer(bitPattern: id))
            }
        }
        guard let request else { return false }
        pending[id] = Pending(
            request: request, url: url, headers: headers, body: body, timeout: timeout, completion: completion, resent: resent)
        guard vs_curl_multi_add(multi, request) == 0 else {
            pending[id] = nil
            vs_curl_request_free(request)
            return false
        }
        return true
    }

    /// Abandons every request without calling its completion, and frees curl's handles.
    func close() {
        guard let multi else { return }
        for (_, entry) in pending {
            vs_curl_multi_remove(multi, entry.request)
            vs_curl_request_free(entry.request)
        }
        pending = [:]
        vs_curl_multi_free(multi)  // closes the connections (the socket callbacks run)
        self.multi = nil
        for (_, event) in sockets { vs_event_free(event) }
        sockets = [:]
        if let timer { vs_event_free(timer) }
        timer = nil
    }

    // MARK: - curl's callbacks (inside curl: no calls back into it)

    private func watch(_ fd: Int32, _ what: Int32) {
        if let old = sockets.removeValue(forKey: fd) {
            vs_event_del(old)
            vs_event_free(old)
        }
        guard what != VS_CURL_POLL_REMOVE, what != VS_CURL_POLL_NONE else { return }
        var flags = Int16(VS_EV_PERSIST)
        if what & VS_CURL_POLL_IN != 0 { flags |= Int16(VS_EV_READ) }
        if what & VS_CURL_POLL_OUT != 0 { flags |= Int16(VS_EV_WRITE) }
        let event = vs_event_new(base, fd, flags, { fd, what, argument in
            Unmanaged<HTTP2Client>.fromOpaque(argument!).takeUnretainedValue().socketReady(fd, what)
        }, Unmanaged.passUnretained(self).toOpaque())
        guard let event else { return }
        vs_event_add(event, -1)
        sockets[fd] = event
    }

    private func setTimer(_ timeoutMS: Int) {
        guard let timer else { return }
        vs_event_del(timer)
        if timeoutMS >= 0 { vs_event_add(timer, Int64(timeoutMS) * 1000) }
    }

    // MARK: - libevent's callbacks

    private func socketReady(_ fd: Int32, _ what: Int16) {
        guard let multi else { return }
        var events: Int32 = 0
        if what & Int16(VS_EV_READ) != 0 { events |= VS_CURL_CSELECT_IN }
        if what & Int16(VS_EV_WRITE) != 0 { events |= VS_CURL_CSELECT_OUT }
        _ = vs_curl_multi_socket_action(multi, fd, events)
        finishDone()
    }

    private func timerFired() {
        guard let multi else { return }
        _ = vs_curl_multi_socket_action(multi, VS_CURL_SOCKET_TIMEOUT, 0)
        finishDone()
    }

    /// Hands every finished transfer to its completion.
    private func finishDone() {
        while let multi = self.multi {
            var result: Int32 = 0
            guard let request = vs_curl_multi_next_done(multi, &result) else { return }
            let id = Int(bitPattern: vs_curl_request_user(request))
            let status = Int(vs_curl_request_status(request))
            var response = Response(
                status: result == 0 ? status : 0, retryAfter: nil, apnsID: nil, body: [], transportError: nil,
                httpVersion: Int(vs_curl_request_http_version(request)),
                newConnections: Int(vs_curl_request_new_connections(request)))
            if result == 0 {
                response.retryAfter = vs_curl_request_header(request, "retry-after").map { String(cString: $0) }
                response.apnsID = vs_curl_request_header(request, "apns-id").map { String(cString: $0) }
                var length = 0
                if let bytes = vs_curl_request_body(request, &length), length > 0 {
                    response.body = Array(UnsafeBufferPointer(start: bytes, count: length))
                }
            } else {
                let detail = String(cString: vs_curl_request_error(request))
                response.transportError = detail.isEmpty ? String(cString: vs_curl_strerror(result)) : detail
            }
            vs_curl_request_free(request)
            guard let entry = pending.removeValue(forKey: id) else { continue }
            // A GOAWAY refuses the streams above its last-stream-id: the service never
            // processed them, and new streams go to a new connection. libcurl retries most
            // of them itself but fails one it was just starting with a framing error; that
            // one goes again at once, once (no answer arrived, so it cannot be a duplicate
            // of an answered push), instead of counting as a failure of the service.
            if result != 0, vs_curl_result_is_stream_refused(result) != 0, response.status == 0, !entry.resent,
                start(url: entry.url, headers: entry.headers, body: entry.body, timeout: entry.timeout,
                      completion: entry.completion, resent: true)
            {
                continue
            }
            entry.completion(response)
        }
    }
}
