import CLibeventShims
import CLinuxShims
import SignalingProtocol
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

extension EventLoop {
    /// Accepts what is waiting on one of this loop's listening sockets, a bounded number
    /// per callback so that a connection flood cannot starve established connections.
    func acceptConnections(tls: Bool) {
        refreshTime()
        // Read once per callback: a reload swaps it for the connections accepted after it.
        let tlsContext = tls ? self.tlsContext : nil
        let listener = tls ? tlsListenFD : listenFD
        guard listener >= 0 else { return }  // stopped (a drain) since libevent reported it
        for _ in 0..<256 {
            var addressHash: UInt64 = 0
            let fd = shim_accept(listener, &addressHash)
            if fd < 0 {
                switch errno {
                case EAGAIN, EWOULDBLOCK, EINTR, ECONNABORTED: break
                case EMFILE, ENFILE:
                    context.logger.error("accept_failed", ["error": "out of file descriptors", "open": table.liveCount])
                default:
                    context.logger.warning("accept_failed", ["error": String(cString: strerror(errno))])
                }
                break
            }
            adopt(fd, addressHash: addressHash, tls: tlsContext)
        }
        flushDirty()
    }

    /// Takes an accepted socket into a slot; `tls` is the context of a connection accepted
    /// on the TLS listener, whose handshake starts when its first bytes arrive.
    private func adopt(_ fd: Int32, addressHash: UInt64, tls tlsContext: TLSServerContext?) {
        let configuration = context.configuration
        guard let slot = table.allocate() else {
            // No slot even to linger in: a best-effort CLOSE (there is no TLS session to
            // carry one on the TLS listener).
            if tlsContext == nil {
                refuseImmediately(fd, Self.serverFull)
            } else {
                close(fd)
            }
            return
        }
        let state = table.state(slot)
        if let tlsContext {
            guard let connection = TLSConnection.accepting(fd: fd, context: tlsContext) else {
                context.logger.error("accept_failed", ["error": "cannot start a TLS connection (out of memory)"])
                close(fd)
                table.release(slot)
                return
            }
            table.setTLS(connection, for: slot)
            state.pointee.flags.insert(.tls)
            context.counters.openTLSConnections.increment()
        }
        configureSocket(fd)
        open(slot, fd: fd, addressHash: addressHash,
             proxied: tlsContext == nil ? configuration.proxyProtocol : configuration.tls?.proxyProtocol == true)
    }

    /// A connection begins in a freshly allocated `slot` (`fd` -1 on an embedded loop,
    /// whose transport knows the slot already): its handshake deadline starts, and unless
    /// a PROXY header is to name its address (`proxied`), its address is admitted or
    /// refused. The first input of the seam (ConnectionIO.swift).
    func open(_ slot: UInt32, fd: Int32, addressHash: UInt64, proxied: Bool) {
        let state = table.state(slot)
        state.pointee.fd = fd
        state.pointee.phase = .awaitingHello
        state.pointee.lastActivity = nowSeconds
        state.pointee.addressHash = UInt32(truncatingIfNeeded: addressHash)
        assignEvent(slot, writable: false)
        context.counters.openConnections.increment()
        openConnections.increment()
        if proxied {
            // The socket's address is the balancer's: the device's address is admitted once
            // the PROXY header names it (`takeProxyHeader`), within the handshake deadline.
            state.pointee.flags.insert(.awaitingProxyHeader)
        } else {
            guard admitAddress(slot) else { return }
            // A front announces a plain connection now; a TLS one after its handshake.
            if frontRelay != nil && !state.pointee.flags.contains(.tls) { openRelay(slot) }
        }
        helloDeadlines.push((slot, state.pointee.generation, nowInstant + context.configuration.handshakeTimeout))
    }

    /// Counts the connection against the cap of its address (`addressHash`): at accept,
    /// or, behind a load balancer, once the PROXY header names the device's address. Over
    /// the cap the connection is refused (CLOSE tooManyConnections) and false is returned.
    /// Admitted uncounted (no room for its address in the table), it is counted in
    /// `connectionsUncountedPerAddress` instead, and its close releases nothing.
    func admitAddress(_ slot: UInt32) -> Bool {
        let state = table.state(slot)
        switch context.admission.admitConnection(from: state.pointee.addressHash) {
        case .refused:
            // Refused through the normal lingering close, so the client reads the CLOSE
            // (closing at once, with its HELLO unread, would reset the connection).
            context.counters.connectionsRefusedPerAddress.increment()
            closeConnection(slot, with: Close(
                code: .tooManyConnections, retryAfterMs: 30_000, retryJitterMs: 30_000,
                message: "more than \(context.admission.maxConnectionsPerAddress) connections from your address"))
            return false
        case .counted:
            state.pointee.flags.insert(.countsTowardAddress)
        case .uncounted:
            context.counters.connectionsUncountedPerAddress.increment()
        }
        context.counters.acceptedConnections.increment()
        if state.pointee.flags.contains(.tls) { context.counters.acceptedTLSConnections.increment() }
        return true
    }

    /// (Re)binds the slot's libevent event to its socket: read unless reading is paused
    /// (`ConnectionFlags.readPaused`), write only while there are unsent bytes (or a pump
    /// yielded).
    func assignEvent(_ slot: UInt32, writable: Bool) {
        let state = table.state(slot)
        defer { if writable { state.pointee.flags.insert(.wantsWrite) } else { state.pointee.flags.remove(.wantsWrite) } }
        if let transport = transport(of: slot) {
            transport.watch(slot, readable: !state.pointee.flags.contains(.readPaused), writable: writable)
            return
        }
        let event = table.event(slot)
        // Event memory starts zeroed (ConnectionTable), so this is false for a slot's first
        // use; deleting an event that is not pending is a no-op.
        if vs_event_initialized(event) != 0 { vs_event_del(event) }
        var flags = VS_EV_PERSIST
        if !state.pointee.flags.contains(.readPaused) { flags |= VS_EV_READ }
        if writable { flags |= VS_EV_WRITE }
        let argument = UnsafeMutableRawPointer(bitPattern: UInt(slot) + 1)
        vs_event_assign(event, base, state.pointee.fd, Int16(flags), { _, what, argument in
            let loop = Unmanaged<EventLoop>.fromOpaque(shim_current_loop()!).takeUnretainedValue()
            loop.owned { loop.connectionReady(UInt32(UInt(bitPattern: argument) - 1), what: Int32(what)) }
        }, argument)
        vs_event_add(event, -1)
    }

    /// Socket options for a long-lived, mostly idle device connection.
    private func configureSocket(_ fd: Int32) {
        let configuration = context.configuration
        // Kernel keep-alive probes must never precede the protocol's own idle timeout:
        // every probe wakes a sleeping phone. They only matter as a backstop.
        let idleTimeout = KeepAlivePolicy.idleTimeout(forInterval: configuration.keepAlive.maximumInterval)
        let tcp = Int32(IPPROTO_TCP)
        try? SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_KEEPALIVE, Int32(1))
        try? SocketCalls.setOption(fd, level: tcp, name: TCP_KEEPIDLE, Int32(idleTimeout) + 60)
        try? SocketCalls.setOption(fd, level: tcp, name: TCP_KEEPINTVL, Int32(30))
        try? SocketCalls.setOption(fd, level: tcp, name: TCP_KEEPCNT, Int32(4))
        // Data the peer never acknowledges (it vanished mid-write) kills the connection
        // after this; its events stay pending for the resume.
        try? SocketCalls.setOption(fd, level: tcp, name: Int32(TCP_USER_TIMEOUT), UInt32(clamping: configuration.tcpUserTimeout.milliseconds))
        // Signalling frames are small and latency-bound.
        try? SocketCalls.setOption(fd, level: tcp, name: TCP_NODELAY, Int32(1))
    }

    /// Best-effort CLOSE to a connection we will not keep, then close.
    /// The CLOSE of a connection that finds no free slot in its loop's table (at accept, at
    /// a hand-over, at a relayed `open`).
    static let serverFull = Close(code: .overloaded, retryAfterMs: 5_000, retryJitterMs: 30_000, message: "server full")

    func refuseImmediately(_ fd: Int32, _ frame: Close) {
        let bytes = FrameEncoder.encode(.close(frame))
        _ = bytes.withUnsafeBytes { SocketCalls.send(fd, $0, flags: Int32(MSG_DONTWAIT)) }
        shutdown(fd, Int32(SHUT_WR))
        close(fd)
    }
}
