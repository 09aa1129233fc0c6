import CLinuxShims
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// TLS in the worker loop (`--tls`): the handshake is stepped by the loop's readiness like
/// everything else, never blocking it; reads and writes of a TLS slot go through OpenSSL.
extension LoadWorker {
    /// TCP is up: TLS first when the run speaks it, then HELLO.
    func transportConnected(slot: Int, now: UInt64) {
        guard let tlsContext else {
            sendHello(slot: slot)
            return
        }
        guard let connection = TLSConnection.connecting(fd: table.fd[slot], context: tlsContext, serverName: setup.tls?.serverName) else {
            connectionLost(slot: slot, reason: "TLS: cannot start a connection", now: now)
            return
        }
        // A reconnect offers the last ticket: the server then skips certificate and signature.
        if let session = table.tlsSession[slot] { connection.offer(session) }
        table.tls[slot] = connection
        table.state[slot] = .securing
        continueTLSHandshake(slot: slot, now: now)
    }

    /// One step of the handshake, after the readiness it asked for.
    func continueTLSHandshake(slot: Int, now: UInt64) {
        guard let connection = table.tls[slot] else { return }
        let fd = table.fd[slot]
        switch connection.handshake() {
        case .done:
            if let mismatch = connection.pinMismatch(against: setup.tls?.pins ?? []) {
                disconnect(slot: slot, reason: "TLS pin mismatch")
                fail(slot: slot, reason: "TLS: \(mismatch)")
                return
            }
            if connection.resumedSession { status.tlsResumedHandshakes += 1 } else { status.tlsFullHandshakes += 1 }
            tlsHandshakeLatency.record(nanoseconds: now &- table.attemptStartedAt[slot])
            sendHello(slot: slot)
        case .wantRead:
            epoll.modify(fd, token: UInt64(slot), events: Epoll.readable)
        case .wantWrite:
            epoll.modify(fd, token: UInt64(slot), events: Epoll.readable | Epoll.writable)
        case .closed:
            connectionLost(slot: slot, reason: "TLS: closed by the server during the handshake", now: now)
        case .failed(let error) where error.isCertificateRejected:
            // It would fail the same way again: the device gives up, and the report says why.
            disconnect(slot: slot, reason: "TLS certificate rejected")
            fail(slot: slot, reason: "TLS: \(error.message)")
        case .failed(let error):
            connectionLost(slot: slot, reason: "TLS: \(error.message)", now: now)
        }
    }

    /// Reads a TLS slot: one record per readiness, then whatever OpenSSL already holds
    /// decrypted (no readiness would announce it). The arrival stamp is the kernel's for
    /// the bytes about to be decrypted, peeked before OpenSSL reads them.
    func readTLS(slot: Int, connection: TLSConnection) {
        let fd = table.fd[slot]
        var arrivedAt: UInt64 = 0
        _ = voipload_peek_stamp(fd, &arrivedAt)
        repeat {
            let result = connection.read(into: readBuffer)
            currentRead = ReadStamps(arrived: arrivedAt, read: voipload_realtime_ns())
            let receivedAt = clock.now().nanoseconds
            switch result {
            case .done(let count):
                process(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count]), slot: slot, receivedAt: receivedAt)
                // A frame may have closed the connection (CLOSE, protocol error).
                guard table.fd[slot] == fd, fd >= 0 else { return }
            case .wantRead, .wantWrite:
                return
            case .closed:
                connectionLost(slot: slot, reason: "closed by server without CLOSE", now: receivedAt)
                return
            case .failed(let error):
                connectionLost(slot: slot, reason: "TLS: \(error.message)", now: receivedAt)
                return
            }
        } while connection.hasBufferedInput
    }

    /// Writes through TLS when the slot has it: the count taken, or -1 with `failure` set.
    /// A TLS write that waits (for either readiness) takes 0 and is retried with the same
    /// bytes first, as OpenSSL requires.
    func writeSome(_ bytes: UnsafeRawBufferPointer, slot: Int, failure: inout String?) -> Int {
        guard let connection = table.tls[slot] else {
            switch SocketCalls.send(table.fd[slot], bytes) {
            case .transferred(let written): return written
            case .wouldBlock: return 0
            case .failed(let code):
                failure = SystemError("send", code).description
                return -1
            }
        }
        switch connection.write(bytes) {
        case .done(let count): return count
        case .wantRead, .wantWrite: return 0
        case .closed:
            failure = "closed by server without CLOSE"
            return -1
        case .failed(let error):
            failure = "TLS: \(error.message)"
            return -1
        }
    }

    /// Releases a slot's TLS state (no close_notify: the tool's disconnects stand for a
    /// phone that lost its network). The session stays for the next connection.
    func releaseTLS(slot: Int) {
        guard let connection = table.tls[slot] else { return }
        connection.free()
        table.tls[slot] = nil
    }
}
