import SignalingProtocol
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The work of the background connect thread: walk the servers (`ServerRotation`),
/// resolving each and trying its addresses in turn; on each, the TCP connect, the TLS
/// handshake when configured, HELLO, and WELCOME. Every wait is bounded by the current
/// address's share of the attempt's deadline and wakes at once when the attempt is
/// cancelled. Runs on that thread only.
struct Handshaker {
    let plan: HandshakePlan
    /// The deadline of the current step: the whole attempt's in `run`, one address's share
    /// of it in the copy that handshakes with that address.
    let deadline: Instant
    let cancel: WakePipe

    func run() throws(ConnectError) -> HandshakenSocket {
        let clock = SystemClock()
        var offer = HelloOffer(hello: plan.hello)
        if let refusal = plan.credentialsRefusal {
            offer.hello.credentials = try freshCredentials(after: refusal)
            offer.refreshed = true
        }
        var rotation = ServerRotation(serverCount: plan.servers.count, preferred: plan.preferredServer, deadline: deadline)
        var step = rotation.start()
        while true {
            try checkCancelled()
            switch step {
            case .failed(let error):
                throw error
            case .resolve(let index):
                let server = plan.servers[index]
                do throws(ConnectError) {
                    let addresses = try plan.resolver(server.host, server.port)
                    guard !addresses.isEmpty else { throw .resolutionFailed(host: server.host, reason: "no IPv4 or IPv6 address") }
                    step = rotation.resolved(addresses, now: clock.now())
                } catch {
                    step = rotation.failed(error, now: clock.now())
                }
            case .connect(let index, let address, let until):
                // The same work, bounded by this address's share of the time.
                let leg = Handshaker(plan: plan, deadline: min(until, deadline), cancel: cancel)
                do {
                    return try leg.handshake(server: index, address: address, offer: &offer)
                } catch {
                    plan.logger.info("server_failed", ["server": plan.servers[index], "address": address, "error": error])
                    step = rotation.failed(error, now: clock.now())
                }
            }
        }
    }

    /// What HELLO carries, as refusals change it during one attempt. Each refusal is
    /// answered at most once per attempt (the resume point is dropped, the credentials
    /// are refreshed) and the answer holds for the servers tried after: in a cluster they
    /// would refuse the same way, and an independent server does not know the session.
    struct HelloOffer {
        var hello: Hello
        var resumeRefused = false
        var refreshed = false
    }

    /// Connects to one address and handshakes, answering a refused resume point or
    /// refused credentials by handshaking again with that address (at most three
    /// handshakes).
    private func handshake(server: Int, address: SocketAddress, offer: inout HelloOffer) throws(ConnectError) -> HandshakenSocket {
        while true {
            try checkCancelled()
            do {
                return try attempt(server: server, address: address, offer: offer)
            } catch .rejected(let close) where offer.hello.resume != nil && close.action == .fresh {
                // PROTOCOL 4.1: a refused resume point changes nothing on the server; connect
                // again at once without it, within the same deadline.
                offer.hello.resume = nil
                offer.resumeRefused = true
            } catch .rejected(let close) where close.action == .refreshCredentials && !offer.refreshed && plan.credentialsProvider != nil {
                // The token expired while the device was away: ask the app once, within the
                // same deadline, before reporting the refusal.
                offer.hello.credentials = try freshCredentials(after: close)
                offer.refreshed = true
            }
        }
    }

    /// Asks the app's provider (it may block: it may ask the app's backend). The attempt
    /// notices a cancellation when it returns, as after a name resolution.
    private func freshCredentials(after refusal: Close) throws(ConnectError) -> [UInt8] {
        // Credentials HELLO cannot carry count as none: the server would close the
        // connection for the frame, with "stop".
        guard let provider = plan.credentialsProvider, let credentials = provider(refusal),
              (1...ProtocolLimits.maxTokenBytes).contains(credentials.count)
        else {
            throw .credentialsUnavailable(refusal)
        }
        try checkCancelled()
        return credentials
    }

    private func checkCancelled() throws(ConnectError) {
        if cancel.isSignalled { throw .cancelled }
    }

    private func attempt(server: Int, address: SocketAddress, offer: HelloOffer) throws(ConnectError) -> HandshakenSocket {
        let socket = try connect(to: address)
        let stream = try openStream(on: socket, server: server)
        do {
            return try handshake(on: stream, server: server, address: address, offer: offer)
        } catch {
            stream.close()
            throw error
        }
    }

    /// The stream HELLO goes over: the socket itself, or TLS on it when the plan has TLS
    /// (handshake, then the pin check). Closes the socket when it throws.
    private func openStream(on socket: SocketHandle, server: Int) throws(ConnectError) -> SocketStream {
        guard let tls = plan.tls else { return SocketStream(plain: socket) }
        let serverName = tls.serverName(for: plan.servers[server])
        guard let connection = TLSConnection.connecting(fd: socket.descriptor, context: tls.context, serverName: serverName) else {
            socket.close()
            throw .tlsHandshakeFailed("cannot start TLS to \(serverName): out of memory, or a name the certificate check cannot use")
        }
        if let session = plan.tlsSessions[server] { connection.offer(session) }
        let stream = SocketStream(socket: socket, tls: connection)
        do throws(ConnectError) {
            while true {
                switch connection.handshake() {
                case .done:
                    if let mismatch = connection.pinMismatch(against: tls.pins) {
                        throw .pinMismatch(presented: mismatch.presented?.description ?? "")
                    }
                    return stream
                case .wantRead: try waitUntil(.readable, stream)
                case .wantWrite: try waitUntil(.writable, stream)
                case .closed: throw .closedDuringHandshake
                case .failed(let error): throw ConnectError(tlsFailure: error)
                }
            }
        } catch {
            stream.close()
            throw error
        }
    }

    /// Waits within the attempt's deadline until the stream's socket is ready.
    private func waitUntil(_ readiness: SocketStream.Readiness, _ stream: SocketStream) throws(ConnectError) {
        switch PollWait.wait(for: stream.socket.descriptor, events: readiness.pollEvents, cancel: cancel, deadline: deadline) {
        case .cancelled: throw .cancelled
        case .timedOut: throw .timedOut
        case .ready: return
        }
    }

    private func connect(to address: SocketAddress) throws(ConnectError) -> SocketHandle {
        let socket = try SocketHandle.tcp(family: address.family)
        let started = address.withSockaddr { pointer, length in
            Result { () throws(SystemError) in try SocketCalls.connect(socket.descriptor, pointer, length: length) }
        }
        let connected: Bool
        switch started {
        case .success(let now): connected = now
        case .failure(let error):
            socket.close()
            throw error.code == ECONNREFUSED ? .refused(address) : .unreachable(address, errno: error.code)
        }
        if !connected {
            switch PollWait.wait(for: socket.descriptor, events: Int16(POLLOUT), cancel: cancel, deadline: deadline) {
            case .cancelled: socket.close(); throw .cancelled
            case .timedOut: socket.close(); throw .timedOut
            case .ready: break
            }
            let code = SocketCalls.pendingError(socket.descriptor)
            if code != 0 {
                socket.close()
                throw code == ECONNREFUSED ? .refused(address) : .unreachable(address, errno: code)
            }
        }
        return socket
    }

    private func handshake(on stream: SocketStream, server: Int, address: SocketAddress, offer: HelloOffer) throws(ConnectError) -> HandshakenSocket {
        try writeAll(FrameEncoder.encode(.hello(offer.hello)), to: stream)
        var assembler = FrameAssembler(maxFrameLength: plan.maxFrameLength)
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let decoded: Frame?
            do throws(ProtocolViolation) {
                decoded = try assembler.next()
            } catch {
                throw .protocolViolation(error.description)
            }
            if let frame = decoded {
                switch frame {
                case .welcome(let welcome):
                    guard welcome.version == ProtocolLimits.version else {
                        throw .protocolViolation("WELCOME for protocol version \(welcome.version), expected \(ProtocolLimits.version)")
                    }
                    guard welcome.keepAliveSeconds >= ProtocolLimits.minimumKeepAliveSeconds else {
                        throw .protocolViolation("WELCOME keep-alive \(welcome.keepAliveSeconds) s is under the 600 s minimum")
                    }
                    return HandshakenSocket(
                        stream: stream, welcome: welcome, server: server, localAddress: stream.socket.localAddress() ?? address.withPort(0),
                        remoteAddress: address, leftover: assembler.takeBuffered(), resumeRefused: offer.resumeRefused,
                        credentials: offer.hello.credentials, tlsSession: stream.resumableTLSSession())
                case .close(let close):
                    throw .rejected(close)
                default:
                    throw .protocolViolation("expected WELCOME or CLOSE, got \(frame.type)")
                }
            }
            // Read before polling: TLS may hold decrypted bytes no poll would announce.
            switch chunk.withUnsafeMutableBytes({ stream.read(into: $0) }) {
            case .moved(let count): assembler.append(contentsOf: chunk[0..<count])
            case .wait(let readiness): try waitUntil(readiness, stream)
            case .closed, .failed(.socket(errno: ECONNRESET)): throw .closedDuringHandshake
            case .failed(.socket(let code)): throw .socketError(operation: "recv", errno: code)
            case .failed(.tls(let error)): throw ConnectError(tlsFailure: error)
            }
        }
    }

    private func writeAll(_ bytes: [UInt8], to stream: SocketStream) throws(ConnectError) {
        var offset = 0
        while offset < bytes.count {
            switch bytes.withUnsafeBytes({ stream.write(UnsafeRawBufferPointer(rebasing: $0[offset...])) }) {
            case .moved(let count): offset += count
            case .wait(let readiness): try waitUntil(readiness, stream)
            case .closed, .failed(.socket(errno: ECONNRESET)), .failed(.socket(errno: EPIPE)): throw .closedDuringHandshake
            case .failed(.socket(let code)): throw .socketError(operation: "send", errno: code)
            case .failed(.tls(let error)): throw ConnectError(tlsFailure: error)
            }
        }
    }
}

extension ConnectError {
    /// A TLS failure during the connect: a rejected certificate, or anything else.
    init(tlsFailure error: TLSError) {
        if error.isCertificateRejected {
            // The shim says "certificate verify failed: <reason>"; the case says the first part.
            let prefix = "certificate verify failed: "
            self = .certificateRejected(error.message.hasPrefix(prefix) ? String(error.message.dropFirst(prefix.count)) : error.message)
        } else {
            self = .tlsHandshakeFailed(error.message)
        }
    }
}
