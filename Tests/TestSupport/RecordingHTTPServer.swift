import Foundation
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A small real HTTP/1.1 server on 127.0.0.1 for tests: it records every request and
/// answers as told: a status, closing the connection, hanging (never answering), or
/// trickling its answer a byte at a time. Keep-alive; requests must carry Content-Length
/// (no chunked bodies). One thread polls every socket; everything else is thread-safe.
///
///     let gateway = try RecordingHTTPServer()
///     gateway.script([.status(500), .ok])      // the next two answers, then `.ok`
///     ... point the client at gateway.url() ...
///     #expect(gateway.waitForRequests(2))
///     let json = gateway.requests[1].body
public final class RecordingHTTPServer: Sendable {
    public struct Request: Sendable {
        public var method: String
        public var path: String
        /// Header names lowercased; a repeated header keeps its last value.
        public var headers: [String: String]
        public var body: [UInt8]
        /// Which accepted connection carried it (1 = the first one).
        public var connection: Int

        public var bodyText: String { String(decoding: body, as: UTF8.self) }
        public func header(_ name: String) -> String? { headers[name.lowercased()] }
    }

    public enum Reply: Sendable, Equatable {
        /// Answers with this status (plus headers and a body), keeping the connection.
        case status(Int, headers: [String: String] = [:], body: String = "")
        /// Reads the request and closes the connection without answering.
        case closeConnection
        /// Reads the request and never answers; the connection stays open until the
        /// client gives up or the server stops.
        case hang
        /// Answers 200, one byte every `millisecondsPerByte`.
        case trickle(millisecondsPerByte: Int)

        public static let ok = Reply.status(200)
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Fixed for the server's lifetime (also across `stopListening`/`startListening`).
    public let port: UInt16
    /// The sockets and their thread. The thread holds only the engine, so releasing the
    /// server (without `stop`) still stops it, in `deinit`.
    private let engine: Engine

    /// Listens on 127.0.0.1:`port` (0 picks a free port).
    public init(port: UInt16 = 0) throws {
        let fd = try Self.listen(port: port)
        self.port = Self.localPort(fd)
        engine = try Engine(listener: fd, port: self.port)
    }

    deinit { stop() }

    /// `http://127.0.0.1:<port><path>`.
    public func url(path: String = "/wake") -> String { "http://127.0.0.1:\(port)\(path)" }

    /// The answer to every request not covered by `script` (initially `.ok`).
    public func reply(_ reply: Reply) {
        engine.shared.withLock { $0.defaultReply = reply }
    }

    /// Answers for the next requests, in order; the default answer follows.
    public func script(_ replies: [Reply]) {
        engine.shared.withLock { $0.script += replies }
    }

    public var requests: [Request] { engine.shared.withLock { $0.requests } }
    public var connectionsAccepted: Int { engine.shared.withLock { $0.connectionsAccepted } }
    public var openConnections: Int { engine.shared.withLock { $0.openConnections } }

    /// Waits until at least `count` requests have arrived. False on timeout.
    public func waitForRequests(_ count: Int, timeout: Duration = .seconds(10)) -> Bool {
        waitUntil(timeout: timeout) { $0.requests.count >= count }
    }

    /// Waits until `condition` holds, checking every millisecond. False on timeout.
    public func waitUntil(timeout: Duration = .seconds(10), _ condition: (RecordingHTTPServer) -> Bool) -> Bool {
        let deadline = SystemClock().now() + timeout
        while !condition(self) {
            guard SystemClock().now() < deadline else { return false }
            usleep(1_000)
        }
        return true
    }

    /// Closes the listening socket and every connection: from now on connecting is
    /// refused (a gateway that is down). Returns once done.
    public func stopListening() {
        engine.run(.stopListening)
    }

    /// Listens again on the same port.
    public func startListening() throws {
        engine.run(.startListening(try Self.listen(port: port)))
    }

    /// Closes everything and ends the thread. Harmless to call twice.
    public func stop() {
        engine.stop()
    }

    private struct Shared {
        var requests: [Request] = []
        var script: [Reply] = []
        var defaultReply = Reply.ok
        var connectionsAccepted = 0
        var openConnections = 0
        var commands: [(Command, DispatchSemaphore)] = []
    }

    private enum Command {
        case stopListening
        case startListening(Int32)
        case stop
    }

    /// One thread polling the listener, every connection and a wake pipe. `shared` is the
    /// only state other threads touch (under its lock); the rest belongs to the thread.
    private final class Engine: @unchecked Sendable {
        let shared = Mutex(Shared())
        private let wakeRead: Int32
        private let wakeWrite: Int32
        private let done = DispatchSemaphore(value: 0)
        private let stopped = Atomic<Bool>(false)
        private var listener: Int32
        private var clients: [Int32: Client] = [:]

        init(listener: Int32, port: UInt16) throws {
            var fds: [Int32] = [0, 0]
            guard pipe(&fds) == 0 else {
                Glibc.close(listener)
                throw Failure(description: "pipe: \(String(cString: strerror(errno)))")
            }
            self.listener = listener
            wakeRead = fds[0]
            wakeWrite = fds[1]
            try? SocketCalls.setNonBlocking(wakeRead)
            for fd in fds { try? SocketCalls.setCloseOnExec(fd) }
            let thread = Thread { [self] in serve() }
            thread.name = "RecordingHTTPServer:\(port)"
            thread.start()
        }

        deinit {
            Glibc.close(wakeRead)
            Glibc.close(wakeWrite)
        }

        func stop() {
            guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
            run(.stop)
            done.wait()
        }

        /// Hands a command to the thread and waits until it has been carried out.
        func run(_ command: Command) {
            let finished = DispatchSemaphore(value: 0)
            shared.withLock { $0.commands.append((command, finished)) }
            var byte: UInt8 = 1
            _ = write(wakeWrite, &byte, 1)
            finished.wait()
        }

        private final class Client {
            let fd: Int32
            let number: Int
            var input: [UInt8] = []
            var output: [UInt8] = []
            /// Set while trickling: when the next byte may go, and the pace.
            var nextByteAt: Instant?
            var pace: Duration = .zero
            var hung = false
            var closeAfterOutput = false

            init(fd: Int32, number: Int) {
                self.fd = fd
                self.number = number
            }
        }

        // MARK: - The server's thread

        private func serve() {
            defer { done.signal() }
            while true {
                var fds = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
                if listener >= 0 { fds.append(pollfd(fd: listener, events: Int16(POLLIN), revents: 0)) }
                let now = SystemClock().now()
                var timeout: Int32 = -1
                for client in clients.values {
                    var events = Int16(POLLIN)
                    if let next = client.nextByteAt {
                        let wait = Int32(clamping: (next - now).milliseconds)
                        timeout = timeout < 0 ? wait : min(timeout, wait)
                    } else if !client.output.isEmpty {
                        events |= Int16(POLLOUT)
                    }
                    fds.append(pollfd(fd: client.fd, events: events, revents: 0))
                }
                _ = poll(&fds, nfds_t(fds.count), timeout)
                if fds[0].revents != 0, !handleCommands() { return }
                for entry in fds.dropFirst() where entry.revents != 0 {
                    if entry.fd == listener {
                        acceptClients()
                    } else if let client = clients[entry.fd] {
                        if entry.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { read(client) }
                    }
                }
                for client in Array(clients.values) { flush(client) }
            }
        }

        /// Returns false when the server must end.
        private func handleCommands() -> Bool {
            var drain = [UInt8](repeating: 0, count: 64)
            while Glibc.read(wakeRead, &drain, drain.count) > 0 {}
            let commands = shared.withLock { shared in
                defer { shared.commands = [] }
                return shared.commands
            }
            var keepRunning = true
            for (command, finished) in commands {
                switch command {
                case .stopListening:
                    closeListenerAndClients()
                case .startListening(let fd):
                    if listener >= 0 { Glibc.close(listener) }
                    listener = fd
                case .stop:
                    closeListenerAndClients()
                    keepRunning = false
                }
                finished.signal()
            }
            return keepRunning
        }

        private func closeListenerAndClients() {
            if listener >= 0 { Glibc.close(listener) }
            listener = -1
            for client in Array(clients.values) { drop(client) }
        }

        private func acceptClients() {
            while true {
                // Close-on-exec: tests spawn server subprocesses, which must not inherit it.
                guard let fd = try? SocketCalls.accept(listener, nonBlocking: true) else { return }
                let number = shared.withLock { shared -> Int in
                    shared.connectionsAccepted += 1
                    shared.openConnections += 1
                    return shared.connectionsAccepted
                }
                clients[fd] = Client(fd: fd, number: number)
            }
        }

        private func read(_ client: Client) {
            var buffer = [UInt8](repeating: 0, count: 16 * 1024)
            while true {
                switch buffer.withUnsafeMutableBytes({ SocketCalls.receive(client.fd, into: $0) }) {
                case .transferred(let count) where count > 0:
                    if !client.hung { client.input += buffer[0..<count] }
                    continue
                case .wouldBlock:
                    break
                case .transferred, .failed:
                    drop(client)
                    return
                }
                break
            }
            while !client.hung, !client.closeAfterOutput, let request = RecordingHTTPServer.parse(&client.input, connection: client.number) {
                let reply = shared.withLock { shared -> Reply in
                    shared.requests.append(request)
                    return shared.script.isEmpty ? shared.defaultReply : shared.script.removeFirst()
                }
                switch reply {
                case .status(let code, let headers, let body):
                    client.output += RecordingHTTPServer.response(code, headers: headers, body: body)
                case .closeConnection:
                    client.closeAfterOutput = true
                case .hang:
                    client.hung = true
                    client.input = []
                case .trickle(let milliseconds):
                    client.output += RecordingHTTPServer.response(200, headers: [:], body: "")
                    client.pace = .milliseconds(Int64(milliseconds))
                    client.nextByteAt = SystemClock().now()
                }
            }
        }

        private func flush(_ client: Client) {
            if let next = client.nextByteAt {
                guard SystemClock().now() >= next, !client.output.isEmpty else { return }
                if client.output.withUnsafeBytes({ SocketCalls.send(client.fd, UnsafeRawBufferPointer(rebasing: $0[..<1])) }) == .transferred(1) {
                    client.output.removeFirst()
                }
                client.nextByteAt = client.output.isEmpty ? nil : SystemClock().now() + client.pace
                return
            }
            while !client.output.isEmpty {
                let sent: Int
                switch client.output.withUnsafeBytes({ SocketCalls.send(client.fd, $0) }) {
                case .transferred(let count) where count > 0: sent = count
                case .transferred, .wouldBlock: return
                case .failed:
                    drop(client)
                    return
                }
                client.output.removeFirst(sent)
            }
            if client.closeAfterOutput { drop(client) }
        }

        private func drop(_ client: Client) {
            guard clients.removeValue(forKey: client.fd) != nil else { return }
            Glibc.close(client.fd)
            shared.withLock { $0.openConnections -= 1 }
        }
    }

    // MARK: - HTTP

    /// Takes one complete request off the front of `input`, if there is one.
    static func parse(_ input: inout [UInt8], connection: Int) -> Request? {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard input.count >= 4,
              let end = (0...(input.count - 4)).first(where: { input[$0..<($0 + 4)].elementsEqual(separator) })
        else { return nil }
        let head = String(decoding: input[0..<end], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst().split(separator: " ")
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        let bodyStart = end + 4
        guard input.count >= bodyStart + length else { return nil }
        let request = Request(
            method: requestLine.count > 0 ? String(requestLine[0]) : "",
            path: requestLine.count > 1 ? String(requestLine[1]) : "",
            headers: headers, body: Array(input[bodyStart..<(bodyStart + length)]), connection: connection)
        input.removeFirst(bodyStart + length)
        return request
    }

    static func response(_ code: Int, headers: [String: String], body: String) -> [UInt8] {
        var text = "HTTP/1.1 \(code) \(reason(code))\r\nContent-Length: \(body.utf8.count)\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { text += "\(name): \(value)\r\n" }
        text += "\r\n" + body
        return Array(text.utf8)
    }

    private static func reason(_ code: Int) -> String {
        switch code {
        case 200: return "OK"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 400: return "Bad Request"
        case 404: return "Not Found"
        case 410: return "Gone"
        case 429: return "Too Many Requests"
        case 500: return "Internal Server Error"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }

    // MARK: - Sockets

    private static func listen(port: UInt16) throws -> Int32 {
        do {
            return try SocketCalls.listenTCP(SocketCalls.socketAddress(0x7F00_0001, port: port), nonBlocking: true)
        } catch {
            throw Failure(description: "cannot listen on 127.0.0.1:\(port): \(error.reason)")
        }
    }

    private static func localPort(_ fd: Int32) -> UInt16 { SocketCalls.localPort(fd) ?? 0 }
}
