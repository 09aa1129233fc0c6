import CLibeventShims
import CLinuxShims
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One HTTP request as the admin API sees it.
struct AdminRequest: Sendable {
    enum Method: Sendable { case get, post, delete, head, other }
    let method: Method
    /// The path, still percent-encoded, without the query.
    let path: String
    let authorization: String?
    let body: [UInt8]
}

/// One HTTP response (an `Error` so that parsing can throw the 4xx it answers with).
struct AdminResponse: Error, Sendable {
    var status: Int
    var contentType: String
    var body: [UInt8]

    static func text(_ status: Int, _ text: String, contentType: String = "text/plain; charset=utf-8") -> AdminResponse {
        AdminResponse(status: status, contentType: contentType, body: Array(text.utf8))
    }
}

/// What answers requests (`AdminAPI`). Called on the admin thread; `respond` may be called
/// at once or later from any thread, exactly once.
protocol AdminRequestHandler: Sendable {
    func handle(_ request: AdminRequest, respond: @escaping @Sendable (AdminResponse) -> Void)
}

/// libevent's HTTP server (evhttp) on its own event base and thread, so that scrapes and
/// backend calls never run on (or wait for) a device loop.
///
/// Threading: everything libevent-related runs on the admin thread. An answer given later
/// from another thread (a message's OK once the store committed it) goes through `inbox`
/// and an eventfd; a request whose client hung up meanwhile is forgotten when libevent
/// reports the close, and its late answer is dropped.
final class AdminHTTPServer: @unchecked Sendable {
    let host: String
    /// The bound port (useful with port 0); set by `start`.
    private(set) var port: UInt16 = 0
    private let handler: any AdminRequestHandler
    private let logger: Logger
    private let maxBodyBytes: Int
    private var base: OpaquePointer?
    private var http: OpaquePointer?
    private var wakeEvent: OpaquePointer?
    private let wakeFD: Int32
    private var thread: JoinableThread?
    private let stopping = Atomic<Bool>(false)
    /// Late answers: (request number, response).
    private let inbox = Mutex<[(Int, AdminResponse)]>([])
    // Admin-thread state.
    /// Requests waiting for a late answer, by number.
    private var waiting: [Int: (request: OpaquePointer, ticket: Unmanaged<CloseTicket>)] = [:]

    /// What libevent hands back when a waiting request's connection closes (retained
    /// while the request waits; released by whichever of the answer and the close comes
    /// first, since answering removes the close callback).
    private final class CloseTicket {
        unowned let server: AdminHTTPServer
        let number: Int
        init(server: AdminHTTPServer, number: Int) {
            self.server = server
            self.number = number
        }
    }
    private var nextNumber = 1

    init(host: String, port: UInt16, maxBodyBytes: Int, handler: any AdminRequestHandler, logger: Logger) throws(ServerError) {
        self.host = host
        self.port = port
        self.handler = handler
        self.logger = logger
        self.maxBodyBytes = maxBodyBytes
        wakeFD = shim_eventfd()
        guard wakeFD >= 0 else { throw ServerError("admin: cannot create an eventfd") }
    }

    deinit {
        close(wakeFD)
    }

    private var unmanagedSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Binds and starts the thread; returns once requests are accepted.
    func start() throws(ServerError) {
        guard let base = vs_event_base_new() else { throw ServerError("admin: cannot create an event base") }
        var bound: UInt16 = 0
        guard let http = vs_httpd_new(base, host, port, Int64(maxBodyBytes), 30, { request, argument in
            let server = Unmanaged<AdminHTTPServer>.fromOpaque(argument!).takeUnretainedValue()
            server.received(request!)
        }, unmanagedSelf, &bound) else {
            let reason = String(cString: strerror(errno))
            vs_event_base_free(base)
            throw ServerError("--admin-listen: cannot listen on \(host):\(port): \(reason)")
        }
        self.base = base
        self.http = http
        self.port = bound
        wakeEvent = vs_event_new(base, wakeFD, Int16(VS_EV_READ | VS_EV_PERSIST), { _, _, argument in
            let server = Unmanaged<AdminHTTPServer>.fromOpaque(argument!).takeUnretainedValue()
            server.runInbox()
        }, unmanagedSelf)
        vs_event_add(wakeEvent, -1)
        thread = JoinableThread(name: "vs-admin") { [self] in
            _ = vs_event_base_dispatch(self.base)
        }
    }

    /// Stops the thread and closes the listener and every admin connection.
    func stop() {
        guard let thread else { return }
        stopping.store(true, ordering: .releasing)
        shim_eventfd_signal(wakeFD)
        thread.join()
        self.thread = nil
        if let wakeEvent { vs_event_free(wakeEvent) }
        // Requests still waiting are freed with their connections (their close callbacks
        // run now, on this thread, the admin thread having finished).
        if let http { vs_httpd_free(http) }
        if let base { vs_event_base_free(base) }
        wakeEvent = nil
        http = nil
        base = nil
    }

    // MARK: Admin thread

    private func received(_ request: OpaquePointer) {
        let method: AdminRequest.Method
        switch vs_httpd_method(request) {
        case VS_HTTPD_GET: method = .get
        case VS_HTTPD_POST: method = .post
        case VS_HTTPD_DELETE: method = .delete
        case VS_HTTPD_HEAD: method = .head
        default: method = .other
        }
        let uri = String(cString: vs_httpd_uri(request))
        let path = String(uri.prefix { $0 != "?" && $0 != "#" })
        let authorization = vs_httpd_header(request, "Authorization").map { String(cString: $0) }
        let length = min(vs_httpd_body_length(request), maxBodyBytes)
        var body = [UInt8](repeating: 0, count: length)
        if length > 0 { body.withUnsafeMutableBytes { _ = vs_httpd_copy_body(request, $0.baseAddress, $0.count) } }

        let number = nextNumber
        nextNumber += 1
        // Answered synchronously (the usual case): sent before `handle` returns. The handler
        // answers exactly once, so either it did so while `slot` was open, or it finds the
        // slot closed and the answer goes through the inbox.
        let slot = AnswerSlot()
        handler.handle(AdminRequest(method: method, path: path, authorization: authorization, body: body)) { response in
            if !slot.keep(response) { self.deliverLate(number, response) }
        }
        let immediate = slot.close()
        if let immediate {
            reply(request, immediate)
            return
        }
        let ticket = Unmanaged.passRetained(CloseTicket(server: self, number: number))
        waiting[number] = (request, ticket)
        vs_httpd_on_close(request, { _, argument in
            let ticket = Unmanaged<CloseTicket>.fromOpaque(argument!)
            let closed = ticket.takeUnretainedValue()
            closed.server.waiting[closed.number] = nil
            ticket.release()
        }, ticket.toOpaque())
    }

    /// Any thread: an answer given after `handle` returned.
    private func deliverLate(_ number: Int, _ response: AdminResponse) {
        inbox.withLock { $0.append((number, response)) }
        shim_eventfd_signal(wakeFD)
    }

    /// Holds an answer given while the request is being handled.
    private final class AnswerSlot: Sendable {
        private let state = Mutex<(open: Bool, response: AdminResponse?)>((true, nil))
        /// Keeps `response` if the slot is still open; false if it was closed.
        func keep(_ response: AdminResponse) -> Bool {
            state.withLock { state in
                guard state.open else { return false }
                state.response = response
                return true
            }
        }
        /// Closes the slot and returns what it kept.
        func close() -> AdminResponse? {
            state.withLock { state in
                state.open = false
                return state.response
            }
        }
    }

    private func runInbox() {
        shim_eventfd_drain(wakeFD)
        if stopping.load(ordering: .acquiring) {
            vs_event_base_loopbreak(base)
            return
        }
        let answers = inbox.withLock { inbox in
            defer { inbox.removeAll() }
            return inbox
        }
        for (number, response) in answers {
            guard let (request, ticket) = waiting.removeValue(forKey: number) else { continue }  // the client left
            reply(request, response)  // removes the close callback
            ticket.release()
        }
    }

    private func reply(_ request: OpaquePointer, _ response: AdminResponse) {
        let reason = Self.reasonPhrase(response.status)
        response.body.withUnsafeBytes { bytes in
            vs_httpd_reply(request, Int32(response.status), reason, response.contentType, bytes.baseAddress, bytes.count)
        }
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        case 413: return "Payload Too Large"
        case 415: return "Unsupported Media Type"
        case 429: return "Too Many Requests"
        case 500: return "Internal Server Error"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }
}
