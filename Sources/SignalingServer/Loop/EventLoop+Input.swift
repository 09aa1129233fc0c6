import CLibeventShims
import CLinuxShims
import SignalingCrypto
import SignalingProtocol
import SignalingStore
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

extension EventLoop {
    /// libevent says the socket of `slot` is readable and/or writable.
    func connectionReady(_ slot: UInt32, what: Int32) {
        activity &+= 1
        refreshTime()
        if table.state(slot).pointee.flags.contains(.tls) {
            tlsConnectionReady(slot, what: what)
        } else {
            if what & VS_EV_WRITE != 0 {
                flushOutbound(slot)
            }
            if what & VS_EV_READ != 0, table.state(slot).pointee.phase != .free {
                readAvailable(slot)
            }
        }
        flushDirty()
    }

    /// Reads until the socket is empty, at most a few buffers per callback (fairness).
    ///
    /// Bytes are peeked, handled, and only then taken off the socket (`takePeeked`). A
    /// read that empties a TCP socket's queue makes the kernel send its ACK then and there,
    /// inside the system call: on loopback that is a whole packet through the stack, 2-3 µs,
    /// which a plain read would put between a MESSAGE_SEND and its push. Taken afterwards,
    /// the ACK goes out once the pushes are written, or rides on the reply when there is
    /// one (WELCOME, PONG, OK), and no packet of its own is sent at all.
    ///
    /// TLS connections read here only while they linger (the input is discarded unread):
    /// their data is read through OpenSSL (`readTLS`).
    func readAvailable(_ slot: UInt32) {
        let state = table.state(slot)
        for _ in 0..<4 {
            let lingering = state.pointee.phase == .closing
            switch SocketCalls.receive(state.pointee.fd, into: readBuffer, flags: lingering ? 0 : Int32(MSG_PEEK)) {
            case .transferred(0):
                peerClosed(slot)
                return
            case .transferred(let count):
                if lingering { continue }  // discarded
                let generation = state.pointee.generation
                received(slot, UnsafeRawBufferPointer(rebasing: readBuffer[..<count]))
                // A connection destroyed meanwhile took its socket and the bytes with it.
                guard table.isLive(slot, generation: generation), takePeeked(count, from: slot) else { return }
                // A connection handing over stops reading at once: the rest is its home loop's.
                if state.pointee.phase == .free || state.pointee.phase == .handingOver || count < readBuffer.count { return }
                if state.pointee.flags.contains(.readPaused) { return }
            case .wouldBlock:
                return
            case .failed(let code):
                socketFailed(slot, errno: code)
                return
            }
        }
    }

    /// Bytes arrived for `slot` (not closing): the connection is active, and its complete
    /// frames are handled. The input of the seam (ConnectionIO.swift) that every read ends in.
    func received(_ slot: UInt32, _ bytes: UnsafeRawBufferPointer) {
        table.state(slot).pointee.lastActivity = nowSeconds
        consume(slot, bytes)
    }

    /// Takes `count` handled bytes off the socket without copying them (`MSG_TRUNC`).
    /// They are queued, so this cannot come up short; if it ever did, the next read would
    /// hand the same frames over again, so the connection is closed instead.
    private func takePeeked(_ count: Int, from slot: UInt32) -> Bool {
        let fd = table.state(slot).pointee.fd
        let taken = SocketCalls.discardPeeked(fd, count: count)
        if taken == .transferred(count) { return true }
        context.logger.warning("read_failed", ["conn": reference(slot), "expected": count, "taken": "\(taken)"])
        destroy(slot)
        return false
    }

    /// Decodes and handles every complete frame; keeps a trailing partial frame (and,
    /// when reading pauses, the frames not handled yet). Called with no bytes to handle
    /// what was kept when reading resumes.
    ///
    /// The loop's `FrameAssembler` (one per loop; a connection keeps only its `inbound`
    /// bytes, nil while idle) decodes whole frames straight out of the shared read buffer:
    /// only the bytes actually received and not yet handled are copied, never a size from
    /// the wire. Kept bytes are always at most the last few reads: reading pauses while
    /// frames wait unhandled.
    func consume(_ slot: UInt32, _ bytes: UnsafeRawBufferPointer) {
        if frontRelay != nil { return relayInput(slot, bytes) }  // a front runs no protocol
        beginReplies(to: slot)
        defer {
            // Events for other devices first: a pushed event must not wait behind the
            // write of this client's replies. This client's own events follow its replies.
            flushDirty(excluding: slot)
            endReplies()
        }
        let state = table.state(slot)
        var assembler = FrameAssembler(decoder: decoder, buffered: state.pointee.inbound ?? [])
        state.pointee.inbound = nil
        assembler.withInput(bytes) { input in
            if table.state(slot).pointee.flags.contains(.awaitingProxyHeader) {
                guard input.takePreamble({ takeProxyHeader(slot, $0) }) > 0 else { return }
            }
            handleFrames(slot, &input)
        }
        if state.pointee.phase != .free && state.pointee.phase != .closing && assembler.bufferedCount > 0 {
            state.pointee.inbound = assembler.takeBuffered()
        }
    }

    /// Handles the complete frames of `input` until the connection closes or its reading
    /// pauses (what is left stays in `input`).
    private func handleFrames(_ slot: UInt32, _ input: inout FrameAssembler.Input) {
        let state = table.state(slot)
        let queueLimit = context.configuration.maxQueuedBytes
        while input.hasUnusedBytes {
            let phase = state.pointee.phase
            guard phase == .awaitingHello || phase == .established else { return }
            // The client sends requests faster than it reads the replies: handle no more
            // until it has read them (the rest is kept in `inbound`; TCP holds back more).
            // Paused only while replies really wait in `outbound`, whose draining resumes it.
            if queuedBytes(slot) + (replySlot == slot ? replies.count : 0) > queueLimit {
                flushReplies()
                if queuedBytes(slot) > queueLimit {
                    pauseReading(slot)
                    return
                }
            }
            do {
                guard let frame = try input.next() else { return }
                handle(frame, on: slot)
            } catch {
                protocolViolation(slot, error)
                input.discardRest()
                return
            }
        }
    }

    /// Closes the connection for a violation, with the code's default advice unless
    /// `action` says otherwise.
    func protocolViolation(
        _ slot: UInt32, _ violation: ProtocolViolation, action: ReconnectAction? = nil,
        retryAfterMs: UInt32 = 0, retryJitterMs: UInt32 = 0
    ) {
        context.counters.protocolErrors.increment()
        if table.state(slot).pointee.phase == .awaitingHello { metrics.recordHandshakeRefused(violation.code) }
        context.logger.debug("protocol_error", ["conn": reference(slot), "code": violation.code.rawValue, "message": violation.message])
        closeConnection(slot, with: Close(
            code: violation.code, action: action, retryAfterMs: retryAfterMs, retryJitterMs: retryJitterMs,
            message: violation.message))
    }

    /// Takes the frame `consuming` and switches on it by value: each case then releases only
    /// its own payload, where a borrowed frame was destroyed by the caller as a whole
    /// `Frame?`, through the runtime's value witnesses (about 100 instructions a frame).
    private func handle(_ frame: consuming Frame, on slot: UInt32) {
        let state = table.state(slot)
        if state.pointee.phase == .awaitingHello {
            let generation = state.pointee.generation
            defer { forgetProxiedPeer(slot, generation: generation) }
            guard case .hello(let hello) = frame else {
                protocolViolation(slot, ProtocolViolation(.frameBeforeHello, "\(frame.type) before HELLO: the first frame must be HELLO"))
                return
            }
            handshake(slot, hello)
            return
        }
        let type = frame.type  // for the refusal below, once the switch has consumed the frame
        switch consume frame {
        case .ping:
            send(.pong, to: slot)
        case .pong:
            break
        case .ack(let seq):
            acknowledge(slot, seq)
        case .request(let id, let request):
            handleRequest(slot, id: id, request)
        case .hello:
            protocolViolation(slot, ProtocolViolation(.duplicateHello, "HELLO on an established connection"))
        case .welcome, .close, .ok, .error, .event:
            protocolViolation(slot, ProtocolViolation(.unknownFrameType, "\(type) frames are sent by servers, not clients"))
        }
    }

    // MARK: Handshake

    /// The first half of a handshake: what needs no routing shard (admission, keep-alive,
    /// the token's HMAC, the costly part) runs on the loop that accepted the connection;
    /// the second half (`register`) on the user's home loop, where the connection lives.
    private func handshake(_ slot: UInt32, _ hello: Hello) {
        let configuration = context.configuration
        let now = context.now()
        guard context.admission.admitHandshake(now: now) else {
            context.counters.handshakesThrottled.increment()
            closeConnection(slot, with: Close(
                code: .overloaded, retryAfterMs: 1_000, retryJitterMs: 10_000,
                message: "too many devices are connecting right now; retry after the advised delay"))
            return
        }
        let interval: UInt32, idleTimeout: UInt32
        switch configuration.keepAlive.negotiate(requested: hello.requestedKeepAliveSeconds) {
        case .grant(let granted, let timeout):
            (interval, idleTimeout) = (granted, timeout)
        case .refuse(let violation):
            protocolViolation(slot, violation)
            return
        }
        if let verifier = tokenVerifier {
            let verdict = verifier.verify(
                hello.credentials, userID: hello.userID, deviceID: hello.deviceID,
                now: Int64(context.wallMilliseconds() / 1000))
            if let refusal = Authentication.refusal(for: verdict, userID: hello.userID) {
                if let suppressed = context.authFailureLog.admit(now: now) {
                    context.logger.warning("auth_failed", [
                        "conn": reference(slot), "peer": peerDescription(slot), "user": hello.userID, "device": hello.deviceID,
                        "code": refusal.close.code.rawValue, "reason": refusal.reason, "suppressed": suppressed,
                    ])
                }
                context.counters.protocolErrors.increment()
                metrics.recordHandshakeRefused(refusal.close.code)
                closeConnection(slot, with: refusal.close)
                return
            }
        }
        let verified = VerifiedHello(hello: hello, keepAliveSeconds: interval, idleTimeoutSeconds: idleTimeout)
        // Before the hold that registers the device, so that until then no `DeviceRecord`
        // refers to the connection and nothing can wake or close it while it moves.
        // Borrowed, as on every path a loop runs per request (`ServerContext.withSwitchboard`).
        if let home = context.withSwitchboard({ $0.homeLoop(of: hello.userID, loopCount: peers.count) }), home != Int(index) {
            beginHandOver(slot, verified, to: UInt16(home))
            return
        }
        register(slot, verified)
    }

    /// The second half of a handshake, on the user's home loop: binds the connection to its
    /// device in the user's shard (a resume, or a takeover of the device's older
    /// connection, which lives on this loop too) and answers WELCOME, or closes it.
    func register(_ slot: UInt32, _ verified: VerifiedHello) {
        // Borrowed: a copy of the reference is a write to the count every loop shares
        // (`ServerContext.withSwitchboard`).
        context.withSwitchboard { switchboard in
            let configuration = context.configuration
            let hello = verified.hello
            let (interval, idleTimeout) = (verified.keepAliveSeconds, verified.idleTimeoutSeconds)
            let now = context.now()
            let ref = reference(slot)
            let wall = context.wallMilliseconds()
            var (outcome, receipts, effects) = switchboard.withState(of: hello.userID, wall: wall, writerWake: .afterCallback(of: self)) { board in
                var effects: [SwitchboardEffect] = []
                let outcome = board.attach(
                    userID: hello.userID, deviceID: hello.deviceID, resume: hello.resume, connection: ref, now: now,
                    into: &effects)
                let receipts = (try? outcome.get()).flatMap { board.group(for: $0.next) }
                return (outcome, receipts, effects)
            }
            if case .success(let grant) = outcome {
                // Receipts of what the resume point acknowledged, for senders of other shards
                // (committed with the resume's acknowledgement).
                let chain = StepChain(now: now, wall: wall, requester: nil, group: receipts)
                effects += switchboard.run(grant.next, chain: chain, on: self, writerWake: .afterCallback(of: self)).effects
                if let claim = grant.claim {
                    // The rest of the held messages, a chunk a hold, each committed on its own.
                    let claiming = StepChain(now: now, wall: wall, requester: nil, group: nil)
                    effects += switchboard.run([claim], chain: claiming, on: self, writerWake: .afterCallback(of: self)).effects
                }
            }
            switch outcome {
            case .failure(let violation):
                apply(effects)
                protocolViolation(slot, violation)
            case .success(let grant):
                let state = table.state(slot)
                state.pointee.phase = .established
                state.pointee.device = grant.record
                state.pointee.idleTimeout = idleTimeout
                state.pointee.sentSeq = grant.sentSeq
                enterIdleWheel(slot)
                context.counters.handshakesCompleted.increment()
                context.counters.establishedConnections.increment()
                if state.pointee.flags.contains(.tls) { context.counters.establishedTLSConnections.increment() }
                send(.welcome(Welcome(
                    sessionID: grant.sessionID, resumed: grant.resumed, keepAliveSeconds: interval,
                    idleTimeoutSeconds: idleTimeout, serverTime: context.wallMilliseconds(),
                    maxFrameLength: UInt32(configuration.maxFrameLength), ackedSeq: grant.ackedSeq,
                    lastSeq: grant.lastSeq)), to: slot)
                context.logger.debug("session", [
                    "conn": ref, "peer": peerDescription(slot), "user": hello.userID, "device": hello.deviceID,
                    "resumed": grant.resumed, "keepalive": interval,
                ])
                apply(effects)
                if grant.needsPump { markDirty(slot, generation: ref.generation) }
            }
        }
    }

    // MARK: Established

    private func acknowledge(_ slot: UInt32, _ seq: UInt64) {
        guard let device = table.state(slot).pointee.device else { return }
        let violation = acknowledge(device, connection: reference(slot), through: seq, wall: context.wallMilliseconds())
        if let violation { protocolViolation(slot, violation) }
    }

    private func handleRequest(_ slot: UInt32, id: UInt32, _ request: Request) {
        guard let device = table.state(slot).pointee.device else { return }
        // Borrowed: a copy of the reference is a write to the count every loop shares
        // (`ServerContext.withSwitchboard`).
        context.withSwitchboard { switchboard in
            context.counters.requestsHandled.increment()
            metrics.recordRequest(request.type)
            let now = context.now()
            let wall = context.wallMilliseconds()
            let ref = reference(slot)
            let writer = switchboard.writer
            if let writer, !writer.isHealthy {
                switch request {
                case .messageSend, .callInvite:
                    // Fail fast while the store cannot commit: nothing would be accepted anyway.
                    send(.error(requestID: id, code: .storeUnavailable, message: "the store is unavailable; retry later"), to: slot)
                    return
                default: break
                }
            }
            let storeTimeout = context.storeTimeoutNanoseconds
            // The first hold is the sender's shard's; a request that spans users goes on to the
            // other users' shards as steps, and one of them may be what answers it.
            // A message to another shard's user, with a store: its OK, deferred until every
            // step's changes are committed (`Switchboard.runMessage`).
            var deferredHandOff: DeferredReply?
            let shard = switchboard.shard(of: device.userID, connectedOn: self)
            var (stepOutcome, effects) = switchboard.withState(shard: shard, wall: wall, writerWake: .afterCallback(of: self)) { board -> (StepOutcome?, [SwitchboardEffect]) in
                var effects: [SwitchboardEffect] = []
                let outcome: StepOutcome
                switch request {
                case .callInvite(let callID, let callee, let offer):
                    outcome = board.invite(callID: callID, callee: callee, offer: offer, from: device, now: now, into: &effects)
                case .callRinging(let callID):
                    outcome = board.ringing(callID: callID, from: device, into: &effects)
                case .callAccept(let callID, let answer):
                    outcome = board.accept(callID: callID, answer: answer, from: device, into: &effects)
                case .callReject(let callID, let reason):
                    outcome = board.reject(callID: callID, reason: reason, from: device, into: &effects)
                case .callCancel(let callID):
                    outcome = board.cancel(callID: callID, from: device, into: &effects)
                case .callHangup(let callID):
                    outcome = board.hangUp(callID: callID, from: device, into: &effects)
                case .messageSend(let message):
                    switch board.send(message, from: device, now: now, into: &effects) {
                    case .success(let acceptance):
                        let deferred = board.deferReply(of: acceptance) {
                            DeferredReply(
                                target: .connection(ref, requestID: id), serverTime: acceptance.serverTime,
                                sender: device.userID, messageID: message.messageID, deadline: now.adding(nanoseconds: storeTimeout))
                        }
                        if let handOff = acceptance.handOff {
                            deferredHandOff = deferred
                            outcome = StepOutcome(reply: nil, next: [handOff])
                        } else if deferred != nil {
                            return (nil, effects)
                        } else {
                            outcome = .answered(.success(acceptance.serverTime))
                        }
                    case .failure(let error):
                        outcome = .answered(.failure(error))
                    }
                case .pushRegister(let platform, let token, let environment, let topic):
                    let registration = PushRegistration(platform: platform, token: token, environment: environment ?? "", topic: topic ?? "")
                    outcome = .answered(board.registerPush(registration, for: device).map { wall })
                }
                return (outcome, effects)
            }
            // A step run by another loop (the owner of its shard) answers through this loop's
            // inbox (`StepChain.requester`).
            let requester = StepChain.Requester(connection: ref, requestID: id)
            if case .messageSend = request, let handOff = stepOutcome?.next.first {
                let (stepReply, stepEffects) = switchboard.runMessage(
                    handOff, deferring: deferredHandOff, requester: requester, on: self, now: now, wall: wall,
                    writerWake: .afterCallback(of: self))
                effects += stepEffects
                // nil: the store writer answers once everything is committed, or a step of
                // another loop answers.
                if stepReply == nil { stepOutcome = nil } else { stepOutcome?.reply = stepReply }
            } else if let next = stepOutcome?.next, !next.isEmpty {
                let answered = stepOutcome?.reply != nil
                let chain = StepChain(now: now, wall: wall, requester: answered ? nil : requester, group: nil)
                let (stepReply, stepEffects) = switchboard.run(next, chain: chain, on: self, writerWake: .afterCallback(of: self))
                effects += stepEffects
                if !answered {
                    // nil: a step of another loop answers.
                    if stepReply == nil { stepOutcome = nil } else { stepOutcome?.reply = stepReply }
                }
            }
            let reply: Frame? = stepOutcome.map { outcome in
                Frame.answer(to: id, outcome.reply ?? .failure(RequestError(.internalError, "the request was not answered")))
            }
            // The reply goes out before any event the request caused for this same connection
            // (those are written when the dirty list is flushed, after this callback).
            if let reply {
                logIfRefusedByLimit(reply, on: slot)
                send(reply, to: slot)
            }
            apply(effects)
        }
    }

    /// A request refused by a backlog or a limit is worth an operator's attention (a device
    /// that never acknowledges, a sender flooding someone, a server at its memory budget),
    /// but a flood of them must not flood the log: one warn line per second, with the count
    /// of lines left out.
    /// Whichever loop decided it: the requesting connection's loop logs a refusal it
    /// sends, the ones other loops' steps decided (a recipient's backlog, on the
    /// recipient's shard) included.
    func logIfRefusedByLimit(_ reply: Frame, on slot: UInt32) {
        guard case .error(_, let code, let message) = reply,
              [.recipientBacklogFull, .senderQuotaExceeded, .rateLimited, .capacityExceeded].contains(code),
              let sender = table.state(slot).pointee.device,
              let suppressed = context.refusalLog.admit(now: context.now())
        else { return }
        context.logger.warning("request_refused", [
            "conn": reference(slot), "user": sender.userID, "device": sender.deviceID, "code": code.rawValue, "detail": message,
            "suppressed": suppressed,
        ])
    }

    /// The peer closed or the socket failed.
    func peerClosed(_ slot: UInt32) {
        destroy(slot)
    }

    /// A read or write failed with `code`: the connection is gone (its events stay
    /// pending). A reset or a closed pipe is routine (a phone changed networks). ETIMEDOUT
    /// means the kernel gave up on a peer that stopped acknowledging data
    /// (`--tcp-user-timeout`): a dead device, or a path that drops packets, worth a warn line.
    func socketFailed(_ slot: UInt32, errno code: Int32) {
        if code == ETIMEDOUT {
            let device = table.state(slot).pointee.device
            context.logger.warning("peer_timed_out", [
                "conn": reference(slot), "user": device?.userID ?? "-", "device": device?.deviceID ?? "-",
                "tcp_user_timeout": context.configuration.tcpUserTimeout.wholeSecondsRoundedUp,
                "detail": "sent data stayed unacknowledged; the connection was dropped and its events stay pending",
            ])
        }
        destroy(slot)
    }
}
