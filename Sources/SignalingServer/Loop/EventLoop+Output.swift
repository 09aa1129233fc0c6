import CLibeventShims
import CLinuxShims
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

extension EventLoop {
    /// Events pumped per switchboard visit; bounds the time the lock is held and the
    /// size of one write.
    static let pumpBatch = 64
    /// Most bytes encoded per batch (a batch always holds at least one event). Whatever
    /// the socket does not take waits in `outbound` and nothing more is taken from the
    /// device's queue until the socket drains it, so a connection's user-space output is
    /// at most this (or `--max-queued-bytes`, if smaller) plus one frame, however large
    /// the device's backlog: the backlog stays in its queue, which the socket's
    /// writability drains.
    static let pumpBytes = 64 * 1024
    /// Batches written per pump before the loop turns to other connections: a fast reader
    /// with a large backlog would otherwise hold the loop for all of it. The pump resumes
    /// on the socket's next writable event.
    static let pumpBatchesPerTurn = 16

    /// Encodes and writes one frame. While a connection's input is being handled, its
    /// replies are collected and written together when the input is done (one write for a
    /// burst of pipelined requests instead of one per reply).
    func send(_ frame: Frame, to slot: UInt32) {
        if replySlot == slot {
            FrameEncoder.append(frame, to: &replies)
            if replies.count >= Self.readBufferSize { flushReplies() }
            return
        }
        scratch.removeAll(keepingCapacity: true)
        FrameEncoder.append(frame, to: &scratch)
        writeScratch(to: slot)
    }

    /// Starts collecting the replies of `slot` (see `send`).
    func beginReplies(to slot: UInt32) {
        replySlot = slot
    }

    /// Writes the collected replies and stops collecting.
    func endReplies() {
        flushReplies()
        replySlot = nil
    }

    func flushReplies() {
        guard let slot = replySlot, !replies.isEmpty else { return }
        swap(&scratch, &replies)
        replies.removeAll(keepingCapacity: true)
        writeScratch(to: slot)
    }

    /// Bytes waiting in the connection's `outbound`.
    func queuedBytes(_ slot: UInt32) -> Int {
        let state = table.state(slot)
        guard let outbound = state.pointee.outbound else { return 0 }
        return outbound.count - Int(state.pointee.outboundOffset)
    }

    /// Writes bytes to the connection: to its socket, or through its TLS connection.
    /// `.wouldBlock`: retry once writable, with the same bytes first (OpenSSL may have put
    /// some of them in a record already).
    @inline(__always)
    func transmit(_ bytes: UnsafeRawBufferPointer, to slot: UInt32) -> IOResult {
        let state = table.state(slot)
        guard state.pointee.flags.contains(.tls) else {
            if let transport = transport(of: slot) { return transport.transmit(bytes, to: slot) }
            return SocketCalls.send(state.pointee.fd, bytes, flags: Int32(MSG_DONTWAIT))
        }
        return transmitTLS(bytes, to: slot)
    }

    /// Writes `scratch` (whole frames) to the connection, or queues what the socket does
    /// not take.
    func writeScratch(to slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.phase != .free else { return }
        if state.pointee.outbound != nil {
            // Only replies and CLOSE get here: the pump waits for an empty `outbound`.
            // Reading pauses past `--max-queued-bytes` (`decodeFrames`), which bounds this.
            state.pointee.outbound!.append(contentsOf: scratch)
            context.noteOutbound(queuedBytes(slot))
            return
        }
        let written: Int
        switch scratch.withUnsafeBytes({ transmit($0, to: slot) }) {
        case .transferred(let count): written = count
        case .wouldBlock: written = 0
        case .failed(let code):
            socketFailed(slot, errno: code)  // EPIPE, ECONNRESET...: the device is gone; its events stay pending
            return
        }
        if written == scratch.count { return }
        keepUnwritten(scratch, written: written, in: slot, at: nowSeconds)
        watchWritable(slot)
    }

    /// Keeps what the socket did not take of `frames` (whole frames, of which `written`
    /// bytes went out) in the connection's `outbound`, starting at the frame the socket
    /// stopped in, so that `outbound` always starts at a frame boundary. Touches no libevent
    /// state (a peer loop calls it too): the owner must then `watchWritable`.
    func keepUnwritten(_ frames: [UInt8], written: Int, in slot: UInt32, at second: UInt32) {
        var frameStart = 0
        while frameStart + 4 <= frames.count {
            let length = Int(frames[frameStart]) << 24 | Int(frames[frameStart + 1]) << 16
                | Int(frames[frameStart + 2]) << 8 | Int(frames[frameStart + 3])
            let frameEnd = frameStart + 4 + length
            if frameEnd > written { break }
            frameStart = frameEnd
        }
        let state = table.state(slot)
        state.pointee.outbound = Array(frames[frameStart...])
        state.pointee.outboundOffset = UInt32(written - frameStart)
        state.pointee.writeProgressSecond = second
        context.noteOutbound(queuedBytes(slot))
    }

    /// The socket became writable: send what waits, or resume a pump that yielded.
    func flushOutbound(_ slot: UInt32) {
        let state = table.state(slot)
        guard let outbound = state.pointee.outbound else {
            assignEvent(slot, writable: false)
            if state.pointee.phase == .established { markDirty(slot, generation: state.pointee.generation) }
            return
        }
        let offset = Int(state.pointee.outboundOffset)
        let written: Int
        switch outbound.withUnsafeBytes({ transmit(UnsafeRawBufferPointer(rebasing: $0[offset...]), to: slot) }) {
        case .transferred(let count): written = count
        case .wouldBlock: return
        case .failed(let code):
            socketFailed(slot, errno: code)
            return
        }
        if written > 0 { state.pointee.writeProgressSecond = nowSeconds }  // the client reads
        if offset + written < outbound.count {
            state.pointee.outboundOffset = UInt32(offset + written)
            return
        }
        state.pointee.outbound = nil
        state.pointee.outboundOffset = 0
        let paused = state.pointee.flags.contains(.readPaused)
        state.pointee.flags.remove(.readPaused)
        assignEvent(slot, writable: false)
        switch state.pointee.phase {
        case .established:
            markDirty(slot, generation: state.pointee.generation)
            // Requests read but held back while replies piled up.
            if paused {
                consume(slot, UnsafeRawBufferPointer(start: nil, count: 0))
                // What OpenSSL decrypted meanwhile is announced by no readiness event.
                if state.pointee.flags.contains(.tls) { readAgainSoon(slot) }
            }
        case .closing: finishWriting(slot)
        default: break
        }
    }

    /// Stops reading a client whose replies pile up (it pipelines requests and reads
    /// nothing): back-pressure through TCP instead of memory. Reading resumes once
    /// `outbound` has drained (`flushOutbound`).
    func pauseReading(_ slot: UInt32) {
        let state = table.state(slot)
        guard !state.pointee.flags.contains(.readPaused) else { return }
        state.pointee.flags.insert(.readPaused)
        assignEvent(slot, writable: state.pointee.flags.contains(.wantsWrite))
    }

    // MARK: Event delivery

    func markDirty(_ slot: UInt32, generation: UInt32) {
        dirtySlots.append((slot, generation))
    }

    /// Writes pending events to every connection marked since the last flush (except
    /// `excluded`, which stays marked).
    func flushDirty(excluding excluded: UInt32? = nil) {
        // Replies posted before these events were decided go first: what the events answer
        // must not overtake them (see `inboxHasTasks`).
        if inboxHasTasks { sendInboxReplies() }
        var kept: (slot: UInt32, generation: UInt32)?
        while !dirtySlots.isEmpty {
            // Walk the marks while pumps mark more in the other (empty) buffer. Should a
            // pump ever flush again, the inner call just finds no spare buffer.
            var batch: [(slot: UInt32, generation: UInt32)] = []
            swap(&batch, &flushingSlots)
            swap(&batch, &dirtySlots)
            for (slot, generation) in batch where table.isLive(slot, generation: generation) {
                if slot == excluded {
                    kept = (slot, generation)
                } else {
                    pump(slot)
                }
            }
            batch.removeAll(keepingCapacity: true)
            flushingSlots = batch
        }
        if let kept { dirtySlots.append(kept) }
    }

    /// Writes the device's unsent events while the socket takes them, a bounded batch at
    /// a time. Stops when the socket is full (the writable callback resumes it once the
    /// client has read), or after `pumpBatchesPerTurn` batches (the next writable event
    /// resumes it, after the loop has served other connections).
    private func pump(_ slot: UInt32) {
        let state = table.state(slot)
        var batches = 0
        while state.pointee.outbound == nil && state.pointee.phase == .established {
            guard let batch = encodeNextBatch(slot) else { return }
            writeScratch(to: slot)
            guard batch.mayHaveMore else { return }
            batches += 1
            if batches == Self.pumpBatchesPerTurn {
                if state.pointee.outbound == nil && state.pointee.phase == .established { assignEvent(slot, writable: true) }
                return
            }
        }
    }

    /// Takes the next batch of the device's unsent events from the switchboard (at most
    /// `pumpBatch` events and, past the first, `pumpBytes`), advances `sentSeq` past it
    /// and encodes it into `scratch`. Returns how many events it holds and whether more
    /// may follow, or nil when there is nothing to write.
    ///
    /// The frames are encoded while the switchboard lock is held: an event's body is one
    /// copy, cheaper than the array of events (and their retains and releases) that
    /// would otherwise carry them out of the lock.
    private func encodeNextBatch(_ slot: UInt32) -> (events: Int, mayHaveMore: Bool)? {
        let state = table.state(slot)
        guard state.pointee.phase == .established, let device = state.pointee.device else { return nil }
        let ref = reference(slot)
        let sentSeq = state.pointee.sentSeq
        let byteLimit = min(Self.pumpBytes, context.configuration.maxQueuedBytes)
        var out: [UInt8] = []
        swap(&out, &scratch)
        out.removeAll(keepingCapacity: true)
        var count = 0
        let writtenAt = LoopMetrics.now()
        // Borrowed: a copy of the reference is a write to the count every loop shares
        // (`ServerContext.withSwitchboard`).
        let batch = context.withSwitchboard { switchboard in
            let shard = switchboard.shard(of: device.userID, connectedOn: self)
            return switchboard.withDevices(shard: shard) { board in
                board.nextBatch(for: device, connection: ref, after: sentSeq, limit: Self.pumpBatch) { seq, event in
                    FrameEncoder.append(event: event.encoded, seq: seq, to: &out)
                    metrics.recordWrite(event, at: writtenAt)
                    count += 1
                    return out.count < byteLimit
                }
            }
        }
        let full = out.count >= byteLimit
        swap(&out, &scratch)
        guard let batch else { return nil }
        state.pointee.sentSeq = batch.position
        if let missing = batch.waitsForBody, !state.pointee.flags.contains(.bodiesRequested) {
            // The next event's body is in the store only: the writer reads it back, and
            // `LoopTask.bodiesLoaded` resumes this pump.
            state.pointee.flags.insert(.bodiesRequested)
            context.switchboard.writer?.requestBodies(of: device, for: ref, from: missing)
        }
        guard count > 0 else { return nil }
        context.counters.eventsWritten.increment(by: count)
        return (count, batch.waitsForBody == nil && (count == Self.pumpBatch || full))
    }

    /// Bytes the socket did not take (from this loop or a peer) wait in `outbound`: watch
    /// for writability, and make sure a client that stops reading is noticed.
    func watchWritable(_ slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.outbound != nil else { return }
        if !state.pointee.flags.contains(.wantsWrite) { assignEvent(slot, writable: true) }
        scheduleStallCheck(slot, dueAt: state.pointee.writeProgressSecond)
    }

    // MARK: Slow consumers

    /// Wheel keys of slow-consumer checks carry this bit; idle-timeout keys do not.
    static let stallCheckKeyBit: UInt64 = 1 << 63

    /// Enters the connection's slow-consumer check in the timing wheel, at the moment it
    /// would be due if the client reads nothing from `since` on (one entry at a time; a
    /// check that finds progress re-enters itself at the new moment).
    private func scheduleStallCheck(_ slot: UInt32, dueAt since: UInt32) {
        let state = table.state(slot)
        guard !state.pointee.flags.contains(.stallCheckScheduled) else { return }
        state.pointee.flags.insert(.stallCheckScheduled)
        let key = Self.stallCheckKeyBit | UInt64(slot) << 32 | UInt64(state.pointee.generation)
        wheel.schedule(key, at: stallDeadline(since: since))
    }

    /// +1: second stamps are rounded down, so this never closes early.
    private func stallDeadline(since: UInt32) -> UInt32 {
        since &+ 1 &+ context.configuration.slowConsumerTimeout.wholeSecondsRoundedUp
    }

    /// A slow-consumer check came round: close the client if it has read nothing for
    /// `--slow-consumer-timeout` while bytes waited for it, else check again later.
    func visitStallCheck(_ key: UInt64) {
        let slot = UInt32(truncatingIfNeeded: (key & ~Self.stallCheckKeyBit) >> 32)
        let generation = UInt32(truncatingIfNeeded: key)
        guard table.isLive(slot, generation: generation) else { return }
        let state = table.state(slot)
        state.pointee.flags.remove(.stallCheckScheduled)
        guard state.pointee.outbound != nil, state.pointee.phase == .established else { return }
        let since = state.pointee.writeProgressSecond
        guard stallDeadline(since: since) <= nowSeconds else {
            scheduleStallCheck(slot, dueAt: since)
            return
        }
        closeSlowConsumer(slot, because: "nothing read for \(nowSeconds &- since) s while \(queuedBytes(slot)) bytes waited")
    }

    /// Closes a client that does not read what is sent to it (CLOSE slowConsumer, right
    /// after the frame in progress).
    func closeSlowConsumer(_ slot: UInt32, because reason: String) {
        let state = table.state(slot)
        context.counters.slowConsumerCloses.increment()
        context.logger.warning("slow_consumer", [
            "conn": reference(slot), "user": state.pointee.device?.userID ?? "-", "queued": queuedBytes(slot),
            "stalled_s": nowSeconds &- state.pointee.writeProgressSecond,
        ])
        dropUnstartedFrames(slot)
        closeConnection(slot, with: Close(
            code: .slowConsumer, retryAfterMs: 1_000, retryJitterMs: 5_000,
            message: "\(reason); events stay pending for the resume"))
    }

    /// Drops the frames of `outbound` that the socket has not begun to take, so that a
    /// CLOSE goes right after the frame in progress. The events among them stay pending
    /// in the device's queue (they were not acknowledged).
    private func dropUnstartedFrames(_ slot: UInt32) {
        let state = table.state(slot)
        guard let outbound = state.pointee.outbound else { return }
        let offset = Int(state.pointee.outboundOffset)
        // Over TLS, a write the socket did not take may sit in a record OpenSSL made
        // already (up to a record's worth of bytes past `offset`); its retry must offer
        // at least those bytes again, so those frames count as begun.
        let begun = state.pointee.flags.contains(.tls) ? offset + Self.tlsMaximumRecord : offset
        // `outbound` starts at a frame boundary: walk to the end of the frame in progress.
        var frameEnd = 0
        while frameEnd < begun && frameEnd + 4 <= outbound.count {
            let length = Int(outbound[frameEnd]) << 24 | Int(outbound[frameEnd + 1]) << 16
                | Int(outbound[frameEnd + 2]) << 8 | Int(outbound[frameEnd + 3])
            frameEnd += 4 + length
        }
        if frameEnd <= offset && !state.pointee.flags.contains(.tls) {
            state.pointee.outbound = nil  // nothing begun is left: the CLOSE goes straight out
            state.pointee.outboundOffset = 0
        } else {
            state.pointee.outbound!.removeSubrange(min(frameEnd, outbound.count)...)
        }
    }

    // MARK: Closing

    /// Sends CLOSE and starts a lingering close. The device (if any) is detached first,
    /// so its unacknowledged events stay pending for its next connection.
    func closeConnection(_ slot: UInt32, with frame: Close) {
        let state = table.state(slot)
        guard state.pointee.phase == .awaitingHello || state.pointee.phase == .established else { return }
        detachDevice(slot)
        relayEnded(slot)
        if replySlot == slot { endReplies() }  // replies already made go out before CLOSE
        // Before its TLS handshake is over a connection has no session to carry a CLOSE in:
        // it just lingers (its peer sees the connection end, as for any lost connection).
        if !state.pointee.flags.contains(.tls) || isTLSEstablished(slot) {
            send(.close(frame), to: slot)
            guard state.pointee.phase != .free else { return }  // the write failed
        }
        linger(slot)
        context.logger.debug("close", ["conn": reference(slot), "code": frame.code.rawValue, "message": frame.message])
    }

    /// Starts the lingering close of a connection whose last bytes are written or queued:
    /// our side shuts down (once `outbound` is written), input is read and discarded until
    /// the peer closes or the linger deadline passes.
    func linger(_ slot: UInt32) {
        let state = table.state(slot)
        state.pointee.phase = .closing
        state.pointee.inbound = nil
        if state.pointee.flags.contains(.readPaused) {
            // Lingering reads (and discards) input, so that the peer can read our CLOSE.
            state.pointee.flags.remove(.readPaused)
            assignEvent(slot, writable: state.pointee.flags.contains(.wantsWrite))
        }
        if state.pointee.outbound == nil { finishWriting(slot) }
        closingDeadlines.push((slot, state.pointee.generation, nowSeconds + Self.lingerSeconds))
    }

    /// Ends our side of the stream once everything is written: TLS's close_notify first,
    /// then the TCP FIN.
    func finishWriting(_ slot: UInt32) {
        let state = table.state(slot)
        if let transport = transport(of: slot) { return transport.finishWriting(slot) }
        if state.pointee.flags.contains(.tls) { table.tls(slot)?.shutdown() }
        shutdown(state.pointee.fd, Int32(SHUT_WR))
    }

    /// Releases everything the connection holds.
    func destroy(_ slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.phase != .free else { return }
        detachDevice(slot)
        relayEnded(slot)
        if replySlot == slot {
            replies.removeAll(keepingCapacity: true)
            replySlot = nil
        }
        let event = table.event(slot)
        if vs_event_initialized(event) != 0 { vs_event_del(event) }
        if state.pointee.flags.contains(.tls) {
            table.takeTLS(slot)?.free()
            context.counters.openTLSConnections.decrement()
        }
        if let transport = transport(of: slot) { transport.release(slot) } else { close(state.pointee.fd) }
        if state.pointee.flags.contains(.countsTowardAddress) { context.admission.releaseConnection(from: state.pointee.addressHash) }
        context.counters.openConnections.decrement()
        openConnections.decrement()
        table.release(slot)
    }

    private func detachDevice(_ slot: UInt32) {
        let state = table.state(slot)
        guard let device = state.pointee.device else { return }
        state.pointee.device = nil
        context.counters.establishedConnections.decrement()
        if state.pointee.flags.contains(.tls) { context.counters.establishedTLSConnections.decrement() }
        let ref = reference(slot)
        let now = context.now()
        // A detach wakes no other connection: it has no effects.
        context.switchboard.withState(of: device.userID, wall: context.wallMilliseconds()) { board in
            board.detach(device, connection: ref, now: now)
        }
    }
}
