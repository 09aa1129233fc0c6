import SignalingClient
import SignalingProtocol
import SignalingSupport

/// The client's events, shown above the prompt (on `queue`).
extension InteractiveSession {
    func handle(_ event: ClientEvent) {
        guard !quitting else { return }
        switch event {
        case .connectionStateChanged(let state):
            connectionStateChanged(state)
        case .incomingCall(let call):
            incomingCall(call)
        case .callRinging(let id, let device):
            guard var call = calls[id], call.direction == .outgoing, call.state == .inviting else { return }
            call.state = .ringing
            call.timeline.ringingAt = clock.now()
            call.peerDevice = device
            calls[id] = call
            self.event("\(call.peer) is ringing (device \(device), after \(Format.milliseconds(call.timeline.inviteToRinging ?? .zero)))")
        case .callAccepted(let id, let device, let answer):
            callAccepted(id, device: device, answer: answer)
        case .callEnded(let id, let reason, let peer, _):
            callEnded(id, reason: reason, peer: peer)
        case .messageReceived(let message):
            messages.add(MessageRecord(id: message.messageID, incoming: true, peer: message.sender,
                                       text: Format.body(message.body, contentType: message.contentType),
                                       atWall: clock.wallMilliseconds(), state: .received))
            self.event("message from \(message.sender): \(Format.body(message.body, contentType: message.contentType))")
        case .deliveryReceipt(let receipt):
            messages.update(receipt.messageID) { record in
                if case .delivered(let devices) = record.state {
                    record.state = .delivered(devices + [receipt.recipientDevice])
                } else {
                    record.state = .delivered([receipt.recipientDevice])
                }
            }
            self.event("message \(Format.short(receipt.messageID)) delivered to \(receipt.recipient)@\(receipt.recipientDevice)")
        case .applicationStateChanged(let state):
            applicationState = state
            switch state {
            case .foreground: self.event("the app is in the foreground")
            case .background: self.event("the app is in the background")
            case .suspended: self.event("the app is suspended")
            }
            updatePrompt()
        case .woken(let reason):
            self.event("woken: \(reason)")
        case .keepAliveAnswered(let roundTrip):
            self.event("PONG after \(Format.milliseconds(roundTrip))")
        case .keepAliveHandlerExpired:
            self.event("the keep-alive handler ran over its budget")
        case .backgroundTaskExpired(let task, let name):
            self.event("background task \(name) (\(task)) expired")
        case .notificationPosted(let notification, let removed):
            self.event("notification: \(notification.title): \(notification.body)"
                       + (removed.map { " (dropped the oldest, \($0.identifier))" } ?? ""))
        case .networkPathChanged(let change):
            self.event("network: \(change)")
        }
    }

    private func connectionStateChanged(_ state: ConnectionState) {
        let before = connectionState
        connectionState = state
        switch state {
        case .connected(let info):
            lastReconnectReason = nil
            if case .connected(let old) = before, old == info { break }
            event("connected to \(info.server ?? common.servers[0]) from \(info.localAddress) (session \(Format.short(info.sessionID.description)), "
                  + "keep-alive \(Int(info.keepAliveInterval.seconds)) s\(info.resumed ? ", resumed" : ""))")
        case .waitingToReconnect(let delay, let reason):
            // A server that stays down fails the same way at every attempt: say it once.
            let text = "\(reason)"
            if text != lastReconnectReason {
                lastReconnectReason = text
                event("connection: \(reason); next attempt in \(Format.seconds(delay)) (retrying with back-off)")
            }
        case .stopped(let reason):
            event("stopped: \(reason). Type 'connect' to try again.")
        case .disconnected:
            event("disconnected")
        case .connecting:
            break
        }
        updatePrompt()
    }

    private func incomingCall(_ incoming: IncomingCall) {
        guard calls[incoming.callID] == nil, let client = session?.client else { return }
        peerMedia[incoming.callID] = MediaDescription.parse(incoming.offer)
        calls.add(CallRecord(id: incoming.callID, direction: .incoming, peer: incoming.caller, peerDevice: incoming.callerDevice,
                             state: .ringing, startedAtWall: clock.wallMilliseconds()))
        event("*** incoming call from \(incoming.caller) (device \(incoming.callerDevice), call \(Format.short(incoming.callID)))"
              + " - type 'answer' or 'reject'")
        console.bell()
        // We show it, so the caller hears ringing.
        client.sendRinging(callID: incoming.callID)
        updateRinging()
    }

    private func callAccepted(_ id: String, device: String, answer: [UInt8]) {
        guard var call = calls[id], call.direction == .outgoing, !call.isOver, call.state != .active else { return }
        call.state = .active
        call.peerDevice = device
        call.timeline.answeredAt = clock.now()
        calls[id] = call
        let media = MediaDescription.parse(answer)
        peerMedia[id] = media
        event("\(call.peer) answered on \(device) (after \(Format.milliseconds(call.timeline.inviteToAnswer ?? .zero)))")
        startBurst(id)
        updatePrompt()
    }

    private func callEnded(_ id: String, reason: CallEndReason, peer: String) {
        guard var call = calls[id] else {
            event("call \(Format.short(id)) with \(peer) ended: \(CallEndText.describe(reason, peer: peer))")
            return
        }
        guard !call.isOver else { return }
        let wasRinging = call.direction == .incoming && call.state == .ringing
        call.timeline.endedAt = clock.now()
        call.state = .ended(CallEndText.describe(reason, peer: peer))
        calls[id] = call
        stopProbe(id)
        if wasRinging && (reason == .cancelled || reason == .noAnswer || reason == .peerDisconnected) {
            event("missed call from \(peer) (\(CallEndText.describe(reason, peer: peer)))")
        } else {
            event("call with \(peer) ended: \(CallEndText.describe(reason, peer: peer))"
                  + (call.timeline.answerToHangup.map { " after \(Format.seconds($0))" } ?? ""))
        }
        updateRinging()
    }

    // MARK: The probe

    /// Starts our burst towards the address the peer announced (after the answer).
    func startBurst(_ id: String) {
        guard let probe = probes[id] else { return }
        switch peerMedia[id] {
        case .success(let description)?:
            probe.beginBurst(to: description.endpoint)
        case .failure(let error)?:
            event("no media probe for call \(Format.short(id)): the peer announced no probe address (\(error))")
        case nil:
            break
        }
    }

    func probeReported(_ id: String, _ report: CallProbe.Report) {
        guard case .burstFinished(let statistics, let peer) = report, var call = calls[id] else { return }
        call.probeResult = statistics
        calls[id] = call
        event(ProbeText.describe(statistics, peer: peer))
    }

    func stopProbe(_ id: String) {
        probes.removeValue(forKey: id)?.stop()
    }
}
