import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Frames from the server: events, replies, keep-alive, CLOSE.
extension ClientCore {
    /// On `queue`: input from a connection's I/O thread. Reports from connections that
    /// are no longer current (replaced after a network change...) are ignored.
    func handle(_ input: ConnectionInput, from id: UInt64) {
        guard case .connected(let connection, _) = lifecycle, connection.id == id else { return }
        switch input {
        case .ended(let end):
            logger.info("connection_ended", ["end": end])
            tearDownConnection()
            switch end {
            case .protocolViolation(let message):
                enterDisconnected(reason: .protocolViolation(message), close: nil, immediate: false)
            case .failed(let code):
                enterDisconnected(reason: .connectionLost(String(cString: strerror(code))), close: nil, immediate: false)
            case .tlsFailed(let message):
                enterDisconnected(reason: .connectionLost("TLS: \(message)"), close: nil, immediate: false)
            case .closedByPeer, .closedLocally:
                enterDisconnected(reason: .connectionLost("closed by the server without CLOSE"), close: nil, immediate: false)
            }
        case .frames(let frames):
            if background.state == .suspended { perform(background.wake(.socketData, now: clock.now())) }
            for frame in frames {
                guard case .connected(let current, _) = lifecycle, current.id == id else { break }
                handle(frame, on: connection)
            }
            rearmTimer()
        }
    }

    private func handle(_ frame: Frame, on connection: Connection) {
        let now = clock.now()
        switch frame {
        case .ping:
            connection.send(FrameEncoder.encode(.pong))
        case .pong:
            if let roundTrip = keepAlive.pongReceived(now: now) { emit(.keepAliveAnswered(roundTrip: roundTrip)) }
            wakeUpsSawPong()
        case .ok(let requestID, let serverTime):
            replied(requestID, .success(RequestAcceptance(serverTime: serverTime)), now: now)
        case .error(let requestID, let code, let message):
            replied(requestID, .failure(ServerRefusal(code: code, message: message)), now: now)
        case .event(let seq, let event):
            if sequencer.receive(seq: seq) {
                if case .message(let message) = event,
                   !recentMessages.insert(sender: message.sender, messageID: message.messageID) {
                    logger.info("duplicate_message_dropped", ["sender": message.sender, "messageId": message.messageID])
                    skip(seq: seq)
                } else {
                    deliver(event, seq: seq)
                }
            } else {
                // Already handed to the app: drop it, but let the server release it.
                scheduleAcknowledgement()
            }
        case .close(let close):
            logger.info("server_close", ["code": close.code, "action": close.action, "message": close.message])
            connection.close()
            tearDownConnection()
            // A node that is going away (or cannot keep the device) is tried last next time.
            preferredServer = ServerRotation.preferred(after: close, connected: preferredServer, serverCount: configuration.servers.count)
            enterDisconnected(reason: .serverClosed(close), close: close, immediate: false)
        case .hello, .welcome, .ack, .request:
            // Client-to-server types, or a second WELCOME: the server broke the protocol.
            connection.abort()
            tearDownConnection()
            enterDisconnected(reason: .protocolViolation("unexpected \(frame.type) from the server"), close: nil, immediate: false)
        }
    }

    private func replied(_ requestID: UInt32, _ result: Result<RequestAcceptance, ServerRefusal>, now: Instant) {
        switch outbox.replied(requestID: requestID, result: result, now: now, retryDelay: configuration.requestRetryDelay) {
        case .completed(let completion, let outcome):
            eventQueue.async { completion(outcome) }
        case .willRetry(let code):
            logger.info("request_retry_later", ["code": code])
        case .unknownRequest:
            logger.warning("reply_to_unknown_request", ["requestId": requestID])
        }
    }

    /// Hands one new event to the app; it counts as processed once the handler returned.
    private func deliver(_ event: Event, seq: UInt64) {
        let clientEvent: ClientEvent
        switch event {
        case .callIncoming(let callID, let caller, let callerDevice, let offer, let serverTime):
            clientEvent = .incomingCall(IncomingCall(callID: callID, caller: caller, callerDevice: callerDevice,
                                                     offer: offer, serverTime: serverTime))
        case .callRang(let callID, let device):
            clientEvent = .callRinging(callID: callID, device: device)
        case .callAccepted(let callID, let device, let answer):
            clientEvent = .callAccepted(callID: callID, device: device, answer: answer)
        case .callEnded(let callID, let reason, let peer, let serverTime):
            clientEvent = .callEnded(callID: callID, reason: reason, peer: peer, serverTime: serverTime)
        case .message(let message):
            clientEvent = .messageReceived(message)
        case .messageDelivered(let messageID, let recipient, let recipientDevice, let serverTime):
            clientEvent = .deliveryReceipt(DeliveryReceipt(messageID: messageID, recipient: recipient,
                                                           recipientDevice: recipientDevice, serverTime: serverTime))
        }
        if background.state != .foreground && configuration.notifiesWhenNotInForeground {
            notifyUser(about: event)
        }
        let hand = handToApp
        let epoch = sequencer.epoch
        eventQueue.async { [weak self] in
            hand(clientEvent)
            guard let self else { return }
            self.queue.async { self.eventProcessed(seq, epoch: epoch) }
        }
    }

    /// A new number carrying a message the app already has: processed without the app, in
    /// turn (after the handlers of earlier events), so the ACK never overtakes them.
    private func skip(seq: UInt64) {
        let epoch = sequencer.epoch
        eventQueue.async { [weak self] in
            guard let self else { return }
            self.queue.async { self.eventProcessed(seq, epoch: epoch) }
        }
    }

    private func eventProcessed(_ seq: UInt64, epoch: Int) {
        sequencer.processed(seq: seq, epoch: epoch)
        scheduleAcknowledgement()
        wakeUpsSawEventProcessed()
    }

    /// One ACK per batch: flushed after everything already queued on `queue`.
    func scheduleAcknowledgement() {
        guard !ackFlushScheduled else { return }
        ackFlushScheduled = true
        queue.async { [self] in flushAcknowledgement() }
    }

    func flushAcknowledgement() {
        ackFlushScheduled = false
        guard let connection = currentConnection, let seq = sequencer.pendingAcknowledgement else { return }
        connection.send(FrameEncoder.encode(.ack(seq: seq)))
        sequencer.acknowledged(through: seq)
    }

    /// Local notifications for events that need the user while the app is not on screen.
    private func notifyUser(about event: Event) {
        switch event {
        case .callIncoming(let callID, let caller, _, _, _):
            post(LocalNotification(identifier: "call-\(callID)", kind: .incomingCall(callID: callID, caller: caller),
                                   title: "Incoming call", body: "\(caller) is calling"))
        case .callEnded(let callID, let reason, let peer, _):
            guard let pending = notifications.notification(identifier: "call-\(callID)"),
                  case .incomingCall = pending.kind else { return }
            switch reason {
            case .answeredElsewhere, .declinedElsewhere:
                notifications.remove(identifier: pending.identifier)  // handled on another device
            default:
                post(LocalNotification(identifier: pending.identifier, kind: .missedCall(callID: callID, caller: peer),
                                       title: "Missed call", body: "Missed call from \(peer)"))
            }
        case .message(let message):
            post(LocalNotification(identifier: "message-\(message.sender)-\(message.messageID)",
                                   kind: .message(messageID: message.messageID, sender: message.sender),
                                   title: "Message from \(message.sender)", body: message.contentType))
        case .callRang, .callAccepted, .messageDelivered:
            break
        }
    }
}
