import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport

/// The commands typed at the prompt (on `queue`).
extension InteractiveSession {
    func execute(_ command: InteractiveCommand) {
        switch command {
        case .call(let user): call(user)
        case .answer(let reference): answer(reference)
        case .reject(let reason, let reference): reject(reason, reference)
        case .cancel(let reference): cancel(reference)
        case .hangUp(let reference): hangUp(reference)
        case .message(let recipient, let text): sendMessage(to: recipient, text)
        case .calls: showCalls()
        case .history: showHistory()
        case .status: showStatus()
        case .ping: ping()
        case .background:
            say("simulating the background: suspended when the 10 s slice is over; socket data, network changes and the keep-alive timer wake the app")
            session?.client.applicationDidEnterBackground()
        case .foreground: session?.client.applicationWillEnterForeground()
        case .connect:
            if case .connected = connectionState { say("already connected") } else { startConnect() }
        case .help: say(InteractiveCommand.helpText)
        case .quit: quit(Outcome.ok("bye"))
        case .nothing: break
        }
    }

    private var connectedSession: SessionInfo? {
        if case .connected(let info) = connectionState { return info }
        return nil
    }

    // MARK: Calls

    private func call(_ user: String) {
        guard let client = session?.client else { return }
        guard user != common.user else { return say("you cannot call yourself") }
        guard let info = connectedSession else {
            return say("not connected (\(ConnectionStateText.describe(connectionState).word)): calls need a live connection")
        }
        let id = UUID().uuidString.lowercased()
        let probe = makeProbe(for: id, session: info)
        var record = CallRecord(id: id, direction: .outgoing, peer: user, state: .inviting, startedAtWall: clock.wallMilliseconds())
        record.timeline.invitedAt = clock.now()
        calls.add(record)
        client.invite(callee: user, offer: MediaSetup.description(of: probe, common), callID: id) { [weak self] result in
            guard let self, case .failure(let error) = result, var call = self.calls[id], !call.isOver else { return }
            call.state = .ended("failed: \(error)")
            self.calls[id] = call
            self.stopProbe(id)
            self.event("the call to \(user) failed: \(error)")
        }
        event("calling \(user) (call \(Format.short(id)))" + (probe.map { ", probe socket \($0.local)" } ?? ""))
    }

    private func answer(_ reference: String?) {
        guard let client = session?.client else { return }
        let found = calls.resolve(reference, what: "ringing incoming") { $0.direction == .incoming && $0.state == .ringing }
        guard case .success(var call) = found else { return say(found.errorMessage) }
        guard let info = connectedSession else { return say("not connected: cannot answer now") }
        let id = call.id
        let probe = makeProbe(for: id, session: info)
        call.state = .answering
        calls[id] = call
        updateRinging()
        client.accept(callID: id, answer: MediaSetup.description(of: probe, common)) { [weak self] result in
            guard let self, var call = self.calls[id], call.state == .answering else { return }
            switch result {
            case .success:
                call.state = .active
                call.timeline.answeredAt = self.clock.now()
                self.calls[id] = call
                self.event("answered \(call.peer) (call \(Format.short(id)))")
                self.startBurst(id)
            case .failure(let error):
                call.state = .ringing
                self.calls[id] = call
                self.stopProbe(id)
                self.event("could not answer \(call.peer): \(error)")
            }
            self.updateRinging()
        }
    }

    private func reject(_ reason: CallEndReason, _ reference: String?) {
        guard let client = session?.client else { return }
        let found = calls.resolve(reference, what: "ringing incoming") { $0.direction == .incoming && $0.state == .ringing }
        guard case .success(let call) = found else { return say(found.errorMessage) }
        let id = call.id
        client.reject(callID: id, reason: reason) { [weak self] result in
            guard let self, var call = self.calls[id], !call.isOver else { return }
            switch result {
            case .success:
                call.state = .ended(reason == .busy ? "you said busy" : "you declined")
                call.timeline.endedAt = self.clock.now()
                self.calls[id] = call
                self.event("\(reason == .busy ? "told \(call.peer) you are busy" : "declined the call from \(call.peer)")")
            case .failure(let error):
                self.event("could not reject the call from \(call.peer): \(error)")
            }
            self.updateRinging()
        }
    }

    private func cancel(_ reference: String?) {
        guard let client = session?.client else { return }
        let found = calls.resolve(reference, what: "unanswered outgoing") {
            $0.direction == .outgoing && ($0.state == .inviting || $0.state == .ringing)
        }
        guard case .success(let call) = found else { return say(found.errorMessage) }
        let id = call.id
        client.cancel(callID: id) { [weak self] result in
            guard let self, var call = self.calls[id], !call.isOver else { return }
            switch result {
            case .success:
                call.state = .ended("you cancelled")
                call.timeline.endedAt = self.clock.now()
                self.calls[id] = call
                self.stopProbe(id)
                self.event("cancelled the call to \(call.peer)")
            case .failure(let error):
                self.event("could not cancel the call to \(call.peer): \(error)")
            }
        }
    }

    private func hangUp(_ reference: String?) {
        guard let client = session?.client else { return }
        let found = calls.resolve(reference, what: "active") { $0.state == .active }
        guard case .success(let call) = found else { return say(found.errorMessage) }
        let id = call.id
        client.hangUp(callID: id) { [weak self] result in
            guard let self, var call = self.calls[id], !call.isOver else { return }
            switch result {
            case .success:
                call.timeline.endedAt = self.clock.now()
                call.state = .ended("you hung up")
                self.calls[id] = call
                self.stopProbe(id)
                self.event("hung up \(call.peer)" + (call.timeline.answerToHangup.map { " after \(Format.seconds($0))" } ?? ""))
            case .failure(let error):
                self.event("could not hang up \(call.peer): \(error)")
            }
            self.updatePrompt()
        }
    }

    /// Opens the probe socket of a call before its offer or answer goes out.
    private func makeProbe(for id: String, session info: SessionInfo) -> CallProbe? {
        switch MediaSetup.makeProbe(common.media, session: info, queue: queue, report: { [weak self] in self?.probeReported(id, $0) }) {
        case .success(let probe):
            probes[id] = probe
            return probe
        case .failure(let error):
            event("no media probe: \(error.message)")
            return nil
        }
    }

    // MARK: Messages

    private func sendMessage(to recipient: String, _ text: String) {
        guard let client = session?.client else { return }
        let id = UUID().uuidString.lowercased()
        messages.add(MessageRecord(id: id, incoming: false, peer: recipient, text: text, atWall: clock.wallMilliseconds(), state: .sending))
        client.send(to: recipient, body: Array(text.utf8), messageID: id) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success:
                self.messages.update(id) { if $0.state == .sending { $0.state = .accepted } }
                self.event("message \(Format.short(id)) to \(recipient) accepted by the server")
            case .failure(let error):
                self.messages.update(id) { $0.state = .failed("\(error)") }
                self.event("message \(Format.short(id)) to \(recipient) failed: \(error)")
            }
        }
        if connectedSession == nil { say("not connected: the message is kept and sent once connected") }
    }

    // MARK: Showing things

    private func ping() {
        guard let client = session?.client else { return }
        if client.pingNow() {
            say("PING sent")
        } else if connectedSession == nil {
            say("not connected")
        } else {
            say("a PING is already waiting for its PONG")
        }
    }

    private func showStatus() {
        guard let status = session?.client.status else { return }
        let (word, detail) = ConnectionStateText.describe(status.connectionState)
        let active = calls.records.filter { $0.state == .active }.count
        let ringing = calls.records.filter { $0.state == .ringing || $0.state == .inviting }.count
        say("""
            connection:  \(word)\(detail.isEmpty ? "" : " (\(detail))")
            server:      \(ServerAddress.describe(common.servers)), as \(common.user)@\(common.device)
            session:     \(status.sessionID?.description ?? "none")
            app state:   \(status.applicationState)
            keep-alive:  \(Int(status.keepAliveInterval.seconds)) s
            last PONG:   \(status.lastPongRoundTrip.map(Format.milliseconds) ?? "none yet (type 'ping')")
            reconnects:  \(status.reconnectCount)
            pending:     \(status.pendingRequests) requests, \(status.pendingNotifications) notifications
            calls:       \(active) active, \(ringing) ringing, \(calls.records.count) in this session; messages: \(messages.records.count)
            """)
    }

    private func showCalls() {
        guard !calls.records.isEmpty else { return say("no calls yet") }
        for call in calls.records {
            var line = "\(Format.short(call.id)) \(Format.timeOfDay(call.startedAtWall)) \(call.direction == .outgoing ? "to" : "from") \(call.peer): "
            switch call.state {
            case .inviting: line += "inviting"
            case .ringing: line += "ringing"
            case .answering: line += "answering"
            case .active: line += "active"
            case .ended(let note): line += "ended (\(note))"
            }
            var timings: [String] = []
            if let value = call.timeline.inviteToRinging { timings.append("invite→ringing \(Format.milliseconds(value))") }
            if let value = call.timeline.inviteToAnswer { timings.append("invite→answer \(Format.milliseconds(value))") }
            if let value = call.timeline.answerToHangup { timings.append("answer→hang-up \(Format.seconds(value))") }
            if !timings.isEmpty { line += "; " + timings.joined(separator: ", ") }
            if let probe = call.probeResult {
                line += "; probe \(probe.received)/\(probe.sent), loss \(Format.percent(probe.lossPercent)) %"
                if let average = probe.averageRoundTrip, let jitter = probe.jitter {
                    line += String(format: ", rtt %.3f ms, jitter %.3f ms", average.seconds * 1000, jitter.seconds * 1000)
                }
            }
            say(line)
        }
    }

    private func showHistory() {
        guard !messages.records.isEmpty else { return say("no messages yet") }
        for message in messages.records {
            let state: String
            switch message.state {
            case .received: state = ""
            case .sending: state = " (sending)"
            case .accepted: state = " (accepted)"
            case .delivered(let devices): state = " (delivered to \(devices.joined(separator: ", ")))"
            case .failed(let reason): state = " (failed: \(reason))"
            }
            say("\(Format.timeOfDay(message.atWall)) \(message.incoming ? "from" : "to") \(message.peer): \(message.text)\(state)")
        }
    }
}

extension Result where Failure == CallLookupError {
    var errorMessage: String {
        if case .failure(let error) = self { return error.message }
        return ""
    }
}
