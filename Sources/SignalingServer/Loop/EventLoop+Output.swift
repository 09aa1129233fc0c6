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

    private func flushReplies() {
        guard let slot = replySlot, !replies.isEmpty else { return }
        swap(&scratch, &replies)
        replies.removeAll(keepingCapacity: true)
        writeScratch(to: slot)
    }

    /// Writes `scratch` to the connection, or queues what the socket does not take.
    func writeScratch(to slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.phase != .free else { return }
        if state.pointee.outbound != nil {
            state.pointee.outbound!.append(contentsOf: scratch)
            enforceQueueLimit(slot)
            return
        }
        let written = scratch.withUnsafeBytes { shim_send(state.pointee.fd, $0.baseAddress, $0.count) }
        if written == scratch.count { return }
        if written < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
            socketFailed(slot, errno: errno)  // EPIPE, ECONNRESET...: the device is gone; its events stay pending
            return
        }
        state.pointee.outbound = Array(scratch[max(0, written)...])
        state.pointee.outboundOffset = 0
        watchWritable(slot)
    }

    func enforceQueueLimit(_ slot: UInt32) {
        let state = table.state(slot)
        guard let outbound = state.pointee.outbound,
              outbound.count - Int(state.pointee.outboundOffset) > context.configuration.maxQueuedBytes
        else { return }
        context.counters.slowConsumerCloses.increment()
        context.logger.info("slow_consumer", ["conn": reference(slot), "queued": outbound.count])
        destroy(slot)  // no room for a CLOSE frame; pending events stay for the resume
    }

    /// The socket became writable: send what waits.
    func flushOutbound(_ slot: UInt32) {
        let state = table.state(slot)
        guard let outbound = state.pointee.outbound else {
            if state.pointee.wantsWrite { assignEvent(slot, writable: false) }
            return
        }
        let offset = Int(state.pointee.outboundOffset)
        let written = outbound.withUnsafeBytes { bytes in
            shim_send(state.pointee.fd, bytes.baseAddress! + offset, bytes.count - offset)
        }
        if written < 0 {
            if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { socketFailed(slot, errno: errno) }
            return
        }
        if offset + written < outbound.count {
            state.pointee.outboundOffset = UInt32(offset + written)
            return
        }
        state.pointee.outbound = nil
        state.pointee.outboundOffset = 0
        assignEvent(slot, writable: false)
        switch state.pointee.phase {
        case .established: markDirty(slot, generation: state.pointee.generation)
        case .closing: shutdown(state.pointee.fd, Int32(SHUT_WR))
        default: break
        }
    }

    // MARK: Event delivery

    func markDirty(_ slot: UInt32, generation: UInt32) {
        dirtySlots.append((slot, generation))
    }

    /// Writes pending events to every connection marked since the last flush (except
    /// `excluded`, which stays marked).
    func flushDirty(excluding excluded: UInt32? = nil) {
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

    /// Writes the device's unsent events while the socket takes them. Stops when the
    /// socket is full; the writable callback resumes it.
    private func pump(_ slot: UInt32) {
        let state = table.state(slot)
        while state.pointee.outbound == nil && state.pointee.phase == .established {
            guard let count = encodeNextBatch(slot) else { return }
            writeScratch(to: slot)
            if count < Self.pumpBatch { return }
        }
    }

    /// Takes the next batch of the device's unsent events from the switchboard, advances
    /// `sentSeq` past it and encodes it into `scratch`. Returns how many events it holds,
    /// or nil when there is nothing to write.
    ///
    /// The frames are encoded while the switchboard lock is held: an event's body is one
    /// copy, cheaper than the array of events (and their retains and releases) that
    /// would otherwise carry them out of the lock.
    private func encodeNextBatch(_ slot: UInt32) -> Int? {
        let state = table.state(slot)
        guard state.pointee.phase == .established, let device = state.pointee.device else { return nil }
        let ref = reference(slot)
        let sentSeq = state.pointee.sentSeq
        var out: [UInt8] = []
        swap(&out, &scratch)
        out.removeAll(keepingCapacity: true)
        var count = 0
        let position = context.switchboard.withDevices { board in
            board.nextBatch(for: device, connection: ref, after: sentSeq, limit: Self.pumpBatch) { seq, event in
                FrameEncoder.append(event: event.encoded, seq: seq, to: &out)
                count += 1
            }
        }
        swap(&out, &scratch)
        guard let position else { return nil }
        state.pointee.sentSeq = position
        guard count > 0 else { return nil }
        context.counters.eventsWritten.increment(by: count)
        return count
    }

    // MARK: Writes by other loops

    /// Called on another loop's thread, which routed new events to `ref`'s device: writes
    /// them to the socket at once if this loop is asleep in epoll. That spares the
    /// hand-off (an eventfd write and a wake-up of this loop's thread, which on a virtual
    /// machine costs as much as the rest of the push). Returns false when the caller must
    /// post the wake-up instead: this loop is awake (it will see the hand-off soon, and
    /// coalesce it with others), or the write did not go as planned.
    ///
    /// Runs under `ownership`, so never alongside this loop's callbacks, and never calls
    /// libevent, which is not thread-safe here: whatever needs the event base (watching
    /// for writability, destroying a broken connection) is left to this loop.
    func writeFromPeer(_ ref: ConnectionRef) -> Bool {
        let handled = ownership.withLockIfAvailable { ownership -> Bool in
            // A stopped loop or a closed connection: the events stay pending for a resume.
            guard ownership.running, table.isLive(ref.slot, generation: ref.generation) else { return true }
            guard ownership.waiting else { return false }
            let state = table.state(ref.slot)
            // Bytes already wait for writability: the writable callback pumps the rest.
            guard state.pointee.outbound == nil else { return true }
            let before = state.pointee.sentSeq
            guard let count = encodeNextBatch(ref.slot) else { return true }
            let written = scratch.withUnsafeBytes { shim_send(state.pointee.fd, $0.baseAddress, $0.count) }
            if written == scratch.count {
                context.counters.crossLoopWrites.increment()
                return count < Self.pumpBatch  // a full batch: the owner pumps the rest
            }
            if written <= 0 {
                // Socket full or broken: nothing went out, so the owner writes it again
                // (and queues it, or destroys the connection, as `writeScratch` does).
                state.pointee.sentSeq = before
                return false
            }
            state.pointee.outbound = Array(scratch[written...])
            state.pointee.outboundOffset = 0
            context.counters.crossLoopWrites.increment()
            post(.watchWritable(ref))
            return true
        }
        return handled ?? false
    }

    /// Bytes the socket did not take (from this loop or a peer) wait in `outbound`: keep
    /// them within the queue limit and watch for writability.
    func watchWritable(_ slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.outbound != nil, !state.pointee.wantsWrite else { return }
        enforceQueueLimit(slot)
        if state.pointee.phase != .free { assignEvent(slot, writable: true) }
    }

    // MARK: Closing

    /// Sends CLOSE and starts a lingering close. The device (if any) is detached first,
    /// so its unacknowledged events stay pending for its next connection.
    func closeConnection(_ slot: UInt32, with frame: Close) {
        let state = table.state(slot)
        guard state.pointee.phase == .awaitingHello || state.pointee.phase == .established else { return }
        detachDevice(slot)
        if replySlot == slot { endReplies() }  // replies already made go out before CLOSE
        send(.close(frame), to: slot)
        guard state.pointee.phase != .free else { return }  // the write failed
        state.pointee.phase = .closing
        state.pointee.phaseSince = nowSeconds
        state.pointee.inbound = nil
        if state.pointee.outbound == nil { shutdown(state.pointee.fd, Int32(SHUT_WR)) }
        closingDeadlines.push((slot, state.pointee.generation, nowSeconds + Self.lingerSeconds))
        context.logger.debug("close", ["conn": reference(slot), "code": frame.code.rawValue, "message": frame.message])
    }

    /// Releases everything the connection holds.
    func destroy(_ slot: UInt32) {
        let state = table.state(slot)
        guard state.pointee.phase != .free else { return }
        detachDevice(slot)
        if replySlot == slot {
            replies.removeAll(keepingCapacity: true)
            replySlot = nil
        }
        let event = table.event(slot)
        if vs_event_initialized(event) != 0 { vs_event_del(event) }
        close(state.pointee.fd)
        if state.pointee.countsTowardAddress { context.admission.releaseConnection(from: state.pointee.addressHash) }
        context.counters.openConnections.decrement()
        openConnections.decrement()
        table.release(slot)
    }

    private func detachDevice(_ slot: UInt32) {
        let state = table.state(slot)
        guard let device = state.pointee.device else { return }
        state.pointee.device = nil
        context.counters.establishedConnections.decrement()
        let ref = reference(slot)
        let now = context.clock.now()
        let effects = context.switchboard.withState(wall: context.clock.wallMilliseconds()) { board in
            board.detach(device, connection: ref, now: now)
            return board.takeEffects()
        }
        apply(effects)
    }
}
