import CLinuxShims
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Reading, decoding and answering frames; writing with back-pressure.
extension LoadWorker {
    func readSocket(slot: Int) {
        if let connection = table.tls[slot] {
            readTLS(slot: slot, connection: connection)
            return
        }
        let fd = table.fd[slot]
        var arrivedAt: UInt64 = 0
        let result = SystemCall.io { Int(voipload_read_stamped(fd, readBuffer.baseAddress, UInt(readBuffer.count), &arrivedAt)) }
        // Stamped before decoding, so the tool's own decoding is not counted as latency.
        currentRead = ReadStamps(arrived: arrivedAt, read: voipload_realtime_ns())
        let receivedAt = clock.now().nanoseconds
        switch result {
        case .transferred(0):
            connectionLost(slot: slot, reason: "closed by server without CLOSE", now: receivedAt)
        case .transferred(let count):
            process(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count]), slot: slot, receivedAt: receivedAt)
        case .wouldBlock:
            break
        case .failed(let code):
            connectionLost(slot: slot, reason: SystemError("read", code).description, now: receivedAt)
        }
    }

    /// Handles the frames of `bytes` (after what the connection kept of its last read)
    /// straight out of the read buffer; a trailing partial frame waits in `partialFrames`.
    func process(_ bytes: UnsafeRawBufferPointer, slot: Int, receivedAt: UInt64) {
        var assembler = FrameAssembler(decoder: decoder, buffered: partialFrames.removeValue(forKey: slot) ?? [])
        var acknowledge = false
        let fd = table.fd[slot]
        let open = assembler.withInput(bytes) { input -> Bool in
            while true {
                let frame: Frame
                do {
                    guard let next = try input.next() else { return true }
                    frame = next
                } catch {
                    protocolFailure(slot: slot, "undecodable frame from the server: \(error)", now: receivedAt)
                    input.discardRest()
                    return false
                }
                handle(frame, slot: slot, receivedAt: receivedAt, acknowledge: &acknowledge)
                // The frame may have closed the connection (CLOSE, protocol error).
                guard table.fd[slot] == fd, fd >= 0 else {
                    input.discardRest()
                    return false
                }
            }
        }
        guard open else { return }
        if assembler.bufferedCount > 0 { partialFrames[slot] = assembler.takeBuffered() }
        // One cumulative ACK per batch of events (docs/PROTOCOL.md 5).
        if acknowledge { send(FrameEncoder.encode(.ack(seq: table.lastSeq[slot])), slot: slot) }
    }

    func handle(_ frame: Frame, slot: Int, receivedAt: UInt64, acknowledge: inout Bool) {
        switch frame {
        case .welcome(let welcome):
            welcomed(welcome, slot: slot, receivedAt: receivedAt)
        case .close(let close):
            closed(by: close, slot: slot, now: receivedAt)
        case .ping:
            send(FrameEncoder.encode(.pong), slot: slot)
        case .pong:
            break
        case .event(let seq, let event):
            guard table.state[slot] == .established else {
                protocolFailure(slot: slot, "event before WELCOME", now: receivedAt)
                return
            }
            acknowledge = true
            if seq <= table.lastSeq[slot] {
                status.duplicates += 1
                return
            }
            table.lastSeq[slot] = seq
            received(event, slot: slot, receivedAt: receivedAt)
        case .ok(let requestID, _):
            replied(requestID: requestID, refused: nil, slot: slot)
        case .error(let requestID, let code, _):
            replied(requestID: requestID, refused: code, slot: slot)
        case .hello, .ack, .request:
            protocolFailure(slot: slot, "client-only frame \(frame.type) from the server", now: receivedAt)
        }
    }

    /// Queues bytes for a connection; a write the kernel (or TLS) does not take completely
    /// keeps the rest and waits for EPOLLOUT.
    func send(_ bytes: [UInt8], slot: Int) {
        let fd = table.fd[slot]
        guard fd >= 0 else { return }
        if unsentBytes[slot] != nil {
            unsentBytes[slot]!.append(contentsOf: bytes)
            return
        }
        var failure: String?
        let written = bytes.withUnsafeBytes { writeSome($0, slot: slot, failure: &failure) }
        if written == bytes.count { return }
        if let failure {
            connectionLost(slot: slot, reason: failure, now: clock.now().nanoseconds)
            return
        }
        unsentBytes[slot] = Array(bytes[written...])
        epoll.modify(fd, token: UInt64(slot), events: Epoll.readable | Epoll.writable)
    }

    func flushUnsent(slot: Int, now: UInt64) {
        guard let pending = unsentBytes.removeValue(forKey: slot) else { return }
        let fd = table.fd[slot]
        var failure: String?
        let written = pending.withUnsafeBytes { writeSome($0, slot: slot, failure: &failure) }
        if written == pending.count {
            epoll.modify(fd, token: UInt64(slot), events: Epoll.readable)
        } else if let failure {
            connectionLost(slot: slot, reason: failure, now: now)
        } else {
            unsentBytes[slot] = Array(pending[written...])
        }
    }
}
