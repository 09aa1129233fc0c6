import CLibeventShims
import SignalingProtocol
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// Why a TLS handshake on the device listener failed: the `reason` label of
/// `voipserver_tls_handshakes_failed_total` and of the `tls_handshake_failed` log line.
enum TLSHandshakeFailure: String, CaseIterable {
    case notTLS = "not_tls", version, alpn, cipher, certificate, socket, other
    /// The client closed the connection before the handshake was over.
    case closed
    /// No complete handshake within `--handshake-timeout` (after the PROXY header, if any).
    case timeout

    init(_ failure: TLSFailureClass) {
        self = TLSHandshakeFailure(rawValue: failure.rawValue) ?? .other
    }
}

/// TLS on the device listener (`--tls-listen`): the same loop, slots and buffers as a plain
/// connection, with OpenSSL between the socket and the frames.
///
/// - Accept: the slot gets its `TLSConnection` (side table) and the `tls` flag; nothing is
///   read or written yet.
/// - Handshake, within the handshake deadline: a PROXY header (`--tls-proxy-protocol`)
///   is taken off the raw socket first, leaving the ClientHello behind it in the socket;
///   then each readiness event steps the handshake, and its want-read or want-write
///   becomes the event's interest.
/// - Established: reads go through `SSL_read` (the plain path's peek-then-take does not
///   apply: the bytes on the socket are records, not frames), reading ahead, until
///   OpenSSL holds nothing more; what it holds, which no readiness event announces, is
///   read at once or on a pass the loop schedules (`readAgainSoon`), and what is still on
///   the socket on the next readiness event.
///   Writes go through `transmit`: `outbound`, back-pressure and slow consumers work as
///   for plain connections.
/// - Close: CLOSE (encrypted), close_notify, then the usual lingering close. Before the
///   handshake is over there is no session to carry a CLOSE: the connection only lingers.
///   `destroy` frees the `TLSConnection`, exactly once.
///
/// Cost: an idle TLS connection holds OpenSSL's SSL object and session (record buffers
/// are released while idle, SSL_MODE_RELEASE_BUFFERS), plus 8 bytes of side table.
extension EventLoop {
    /// The largest TLS record's plaintext: what OpenSSL may hold of a write it could not
    /// send yet.
    static let tlsMaximumRecord = 16_384

    /// libevent says the socket of a TLS connection is readable and/or writable.
    func tlsConnectionReady(_ slot: UInt32, what: Int32) {
        let state = table.state(slot)
        switch state.pointee.phase {
        case .awaitingHello where !isTLSEstablished(slot):
            advanceTLSHandshake(slot)
        case .awaitingHello, .established:
            if what & VS_EV_WRITE != 0 { flushOutbound(slot) }
            // A read that had to write (the answer to a key update) waited for writability.
            let readable = what & VS_EV_READ != 0 || (what & VS_EV_WRITE != 0 && state.pointee.outbound == nil)
            if readable, state.pointee.phase == .awaitingHello || state.pointee.phase == .established { readTLS(slot) }
        case .closing:
            if what & VS_EV_WRITE != 0 { flushOutbound(slot) }
            // Lingering input is discarded unread, records and all.
            if what & VS_EV_READ != 0, state.pointee.phase == .closing { readAvailable(slot) }
        case .free, .handingOver:
            break
        }
    }

    /// The TLS handshake is over (always true once a HELLO has been handled).
    @inline(__always)
    func isTLSEstablished(_ slot: UInt32) -> Bool {
        table.state(slot).pointee.phase == .established || table.tls(slot)?.version != nil
    }

    /// Steps the handshake as far as the socket allows (after the PROXY header, if one is
    /// awaited), and reads the first frames once it is over.
    private func advanceTLSHandshake(_ slot: UInt32) {
        let state = table.state(slot)
        if state.pointee.flags.contains(.awaitingProxyHeader) {
            guard takeRawProxyHeader(slot) else { return }
        }
        guard let tls = table.tls(slot) else { return }
        switch tls.handshake() {
        case .done:
            if tls.resumedSession {
                context.counters.tlsHandshakesResumed.increment()
            } else {
                context.counters.tlsHandshakesFull.increment()
            }
            if state.pointee.flags.contains(.wantsWrite) { assignEvent(slot, writable: false) }
            if frontRelay != nil {
                openRelay(slot)
                guard state.pointee.phase == .awaitingHello else { return }  // refused: no route
            }
            // The HELLO may have come with the client's Finished.
            readTLS(slot)
        case .wantRead:
            if state.pointee.flags.contains(.wantsWrite) { assignEvent(slot, writable: false) }
        case .wantWrite:
            if !state.pointee.flags.contains(.wantsWrite) { assignEvent(slot, writable: true) }
        case .closed:
            tlsHandshakeFailed(slot, .closed, detail: "the client closed the connection during the handshake")
        case .failed(let error):
            tlsHandshakeFailed(slot, TLSHandshakeFailure(tls.failureClass), detail: error.message)
        }
    }

    /// Takes the PROXY header off the raw socket, leaving the TLS records behind it there
    /// for OpenSSL. Bytes are peeked; a partial header is taken and kept in `inbound` (so
    /// the socket does not stay readable for nothing), a complete one only up to its end.
    /// Returns true once the header is complete and the connection admitted.
    private func takeRawProxyHeader(_ slot: UInt32) -> Bool {
        let state = table.state(slot)
        let generation = state.pointee.generation
        let count: Int
        switch SocketCalls.receive(state.pointee.fd, into: readBuffer, flags: Int32(MSG_PEEK)) {
        case .transferred(0):
            peerClosed(slot)
            return false
        case .transferred(let peeked): count = peeked
        case .wouldBlock: return false
        case .failed(let code):
            socketFailed(slot, errno: code)
            return false
        }
        state.pointee.lastActivity = nowSeconds
        let kept = state.pointee.inbound ?? []
        let bytes = kept + UnsafeRawBufferPointer(rebasing: readBuffer[..<count])
        let used = bytes.withUnsafeBytes { takeProxyHeader(slot, $0) }
        // A refused header or address closed the connection (without CLOSE: no TLS yet).
        guard table.isLive(slot, generation: generation), state.pointee.phase == .awaitingHello else { return false }
        let take = used == 0 ? count : used - kept.count
        _ = SocketCalls.discardPeeked(state.pointee.fd, count: take)
        state.pointee.inbound = used == 0 ? bytes : nil
        return used > 0
    }

    /// Reads and handles what the TLS connection has: records until OpenSSL holds no more
    /// input (the rest waits on the socket for its readiness event). At most a few buffers per
    /// callback (fairness): the rest is read on the loop's next pass.
    func readTLS(_ slot: UInt32) {
        let state = table.state(slot)
        guard let tls = table.tls(slot) else { return }
        let generation = state.pointee.generation
        for _ in 0..<4 {
            // Fill the shared buffer: one SSL_read returns one record at most.
            var filled = 0
            var stop: TLSStatus?
            while filled < readBuffer.count {
                let status = tls.read(into: UnsafeMutableRawBufferPointer(rebasing: readBuffer[filled...]))
                guard case .done(let count) = status else {
                    stop = status
                    break
                }
                filled += count
                // The socket's readiness is level-triggered: it announces records still on
                // the socket. Only what OpenSSL holds needs another SSL_read now; without
                // this, every readable event ended in an SSL_read that found the socket
                // empty (a recv returning EAGAIN, record buffers taken and released).
                if !tls.hasBufferedInput {
                    stop = .wantRead
                    break
                }
            }
            if filled > 0 {
                state.pointee.lastActivity = nowSeconds
                consume(slot, UnsafeRawBufferPointer(rebasing: readBuffer[..<filled]))
                guard table.isLive(slot, generation: generation),
                      state.pointee.phase == .awaitingHello || state.pointee.phase == .established
                else { return }
                // Reading resumes when the replies have drained (`flushOutbound`).
                if state.pointee.flags.contains(.readPaused) { return }
            }
            switch stop {
            case nil:
                continue  // the buffer is full: there may be more
            case .wantRead?:
                return
            case .wantWrite?:
                if !state.pointee.flags.contains(.wantsWrite) { assignEvent(slot, writable: true) }
                return
            case .closed?:
                peerClosed(slot)
                return
            case .failed(let error)?:
                context.logger.debug("tls_failed", ["conn": reference(slot), "detail": error.message])
                destroy(slot)
                return
            case .done?:
                return  // not reached: `done` keeps filling
            }
        }
        readAgainSoon(slot)
    }

    /// Runs the connection's read callback on the loop's next pass: decrypted bytes that
    /// OpenSSL holds are announced by no readiness event.
    func readAgainSoon(_ slot: UInt32) {
        vs_event_activate(table.event(slot), Int16(VS_EV_READ))
    }

    /// `transmit` for a TLS connection: SSL_write, partial writes allowed; wanting the
    /// socket (to write, or to read first) is `.wouldBlock` to the caller.
    func transmitTLS(_ bytes: UnsafeRawBufferPointer, to slot: UInt32) -> IOResult {
        guard bytes.count > 0 else { return .transferred(0) }
        guard let tls = table.tls(slot) else { return .failed(errno: EPIPE) }
        switch tls.write(bytes) {
        case .done(let count): return .transferred(count)
        case .wantWrite, .wantRead: return .wouldBlock
        case .closed: return .failed(errno: EPIPE)
        case .failed: return .failed(errno: ECONNRESET)
        }
    }

    /// Counts and logs a failed handshake (at most one line a second, with the number
    /// left out: scanners and outdated clients make many), then closes the connection,
    /// lingering so that the client can read OpenSSL's alert.
    private func tlsHandshakeFailed(_ slot: UInt32, _ reason: TLSHandshakeFailure, detail: String) {
        recordTLSHandshakeFailure(reason)
        if let suppressed = context.tlsHandshakeLog.admit(now: nowInstant) {
            context.logger.info("tls_handshake_failed", [
                "conn": reference(slot), "peer": peerDescription(slot), "reason": reason.rawValue, "detail": detail,
                "suppressed": suppressed,
            ])
        }
        forgetProxiedPeer(slot, generation: table.state(slot).pointee.generation)
        linger(slot)
    }

    func recordTLSHandshakeFailure(_ reason: TLSHandshakeFailure) {
        context.counters.tlsHandshakesFailed.increment()
        metrics.recordTLSHandshakeFailed(reason)
    }
}
