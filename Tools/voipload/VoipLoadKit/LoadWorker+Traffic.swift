import CLinuxShims
import SignalingProtocol
import SignalingSupport

/// Push-latency probes, the fan-out load, and what the receiving devices do with them.
///
/// A probe's body (message body or call offer) is
///
///     sentAt: u64 (CLOCK_MONOTONIC ns, shared by all processes of the machine)
///     runID:  u64 (this run; events left over from an earlier run are not counted)
///     zero padding up to --payload-bytes
///
/// and is the last field of both MESSAGE_SEND and CALL_INVITE, so the send time is
/// written into the already-encoded frame just before it goes to the kernel.
/// A request of the probe sender's (or an idle device's) whose answer is no latency
/// probe's: a probe to a push user, or what follows a call.
enum SpecialRequest {
    /// A MESSAGE_SEND to a push user.
    case pushMessage
    /// A CALL_INVITE to a push user: cancelled once accepted.
    case pushCall(callID: String)
    /// CALL_HANGUP or CALL_CANCEL of the probe sender's.
    case followUp
}

extension LoadWorker {
    static let probeContentType = "application/x-voipload"
    static let probeHeaderBytes = 16

    var runTag: String { String(setup.runID & 0xff_ffff, radix: 16) }

    func sendDueProbes(now: UInt64) {
        guard probe.isSending else { return }
        let slot = layout.probeSenderSlot
        guard table.state[slot] == .established, setup.idleDevices > 0 else { return }
        let due = probe.due(now: now)
        while probe.sent < due && table.state[slot] == .established {
            let number = probe.sent
            let asCall = probe.mix == .call || (probe.mix == .both && number % 2 == 1)
            // A quarter of the probes to push users, messages and calls alike (with `both`).
            let toPush = setup.pushUsers > 0 && (number % 8 == 2 || number % 8 == 7)
            let target = toPush
                ? WorkloadLayout.pushUser(random.below(setup.pushUsers)) : WorkloadLayout.idleUser(random.below(setup.idleDevices))
            let callID = "c\(runTag).\(setup.worker).\(number)"
            let request: Request = asCall
                ? .callInvite(callID: callID, callee: target, offer: probeBody())
                : .messageSend(OutgoingMessage(
                    messageID: "m\(runTag).\(number)", recipient: target,
                    contentType: Self.probeContentType, body: probeBody()))
            if toPush {
                specialRequests[nextRequestID] = asCall ? .pushCall(callID: callID) : .pushMessage
                status.pushProbesSent += 1
            } else {
                status.probesSent += 1
            }
            sendStamped(request, slot: slot)
            probe.sent += 1
        }
        if !probe.isSending { status.probesDone = true }
    }

    func sendFanout(now: UInt64) {
        guard fanout.sending, setup.fanoutDevices > 0 else { return }
        let slot = layout.fanoutSenderSlot
        let completed = status.fanoutReceipts / UInt64(layout.fanoutDevicesPerUser)
        while table.state[slot] == .established && status.fanoutSent - completed < UInt64(fanout.window) {
            let request = Request.messageSend(OutgoingMessage(
                messageID: "f\(runTag).\(status.fanoutSent)", recipient: layout.fanoutRecipient(ofMessage: status.fanoutSent),
                contentType: Self.probeContentType, body: probeBody()))
            sendStamped(request, slot: slot)
            status.fanoutSent += 1
        }
    }

    func probeBody() -> [UInt8] {
        var body = [UInt8](repeating: 0, count: max(Self.probeHeaderBytes, setup.payloadBytes))
        for index in 0..<8 { body[8 + index] = UInt8(truncatingIfNeeded: setup.runID >> UInt64(56 - 8 * index)) }
        return body
    }

    /// Encodes the request, then stamps the send time into the body's first 8 bytes.
    func sendStamped(_ request: Request, slot: Int) {
        var frame = FrameEncoder.encode(.request(id: nextRequestID, request))
        nextRequestID &+= 1
        let stampOffset = frame.count - max(Self.probeHeaderBytes, setup.payloadBytes)
        // CLOCK_REALTIME: the clock of the kernel's receive timestamps.
        let sentAt = voipload_realtime_ns()
        for index in 0..<8 { frame[stampOffset + index] = UInt8(truncatingIfNeeded: sentAt >> UInt64(56 - 8 * index)) }
        send(frame, slot: slot)
    }

    /// The send time of a probe of this run, or nil for anything else.
    func probeSentAt(_ body: [UInt8]) -> UInt64? {
        guard body.count >= Self.probeHeaderBytes else { return nil }
        var sentAt: UInt64 = 0
        var runID: UInt64 = 0
        for index in 0..<8 {
            sentAt = sentAt << 8 | UInt64(body[index])
            runID = runID << 8 | UInt64(body[8 + index])
        }
        return runID == setup.runID ? sentAt : nil
    }

    func received(_ event: Event, slot: Int, receivedAt: UInt64) {
        switch (layout.role(ofSlot: slot), event) {
        case (.idleDevice, .message(let message)):
            guard let sentAt = probeSentAt(message.body) else { status.unexpectedEvents += 1; return }
            messageLatency.record(nanoseconds: arrival(sentAt))
            readLatency.record(nanoseconds: currentRead.read &- sentAt)
            status.probesReceived += 1
        case (.idleDevice, .callIncoming(let callID, _, _, let offer, _)):
            guard let sentAt = probeSentAt(offer) else { status.unexpectedEvents += 1; return }
            callLatency.record(nanoseconds: arrival(sentAt))
            readLatency.record(nanoseconds: currentRead.read &- sentAt)
            status.probesReceived += 1
            switch setup.callAnswer {
            case .reject:
                // Decline at once, which ends the call on the server (no ring timeout to wait).
                sendRequest(.callReject(callID: callID, reason: .declined), slot: slot)
            case .accept:
                sendRequest(.callRinging(callID: callID), slot: slot)
                sendRequest(.callAccept(callID: callID, answer: [0]), slot: slot)
            }
        case (.idleDevice, .callEnded):
            break  // a call that ended before it was declined (e.g. during a storm), or was hung up
        case (.probeSender, .messageDelivered):
            status.probeReceipts += 1
        case (.probeSender, .callEnded):
            status.callsEnded += 1
        case (.probeSender, .callRang):
            break
        case (.probeSender, .callAccepted(let callID, _, _)):
            status.callsAnswered += 1
            specialRequests[nextRequestID] = .followUp
            sendRequest(.callHangup(callID: callID), slot: slot)
        case (.fanoutSender, .messageDelivered):
            status.fanoutReceipts += 1
        case (.fanoutDevice, .message(let message)):
            guard let sentAt = probeSentAt(message.body) else { status.unexpectedEvents += 1; return }
            fanoutLatency.record(nanoseconds: arrival(sentAt))
            status.fanoutDelivered += 1
        default:
            status.unexpectedEvents += 1
        }
    }

    /// Send to arrival at the device's socket, for a probe stamped `sentAt` in the read
    /// being processed. Without a kernel timestamp (counted) the read stands in for it.
    func arrival(_ sentAt: UInt64) -> UInt64 {
        guard currentRead.arrived != 0 else {
            status.unstampedEvents += 1
            return currentRead.read &- sentAt
        }
        // The two clocks are read a hair apart: an arrival stamped before the send is 0.
        return currentRead.arrived > sentAt ? currentRead.arrived - sentAt : 0
    }

    /// Sends a request with the next request id.
    func sendRequest(_ request: Request, slot: Int) {
        send(FrameEncoder.encode(.request(id: nextRequestID, request)), slot: slot)
        nextRequestID &+= 1
    }

    /// OK or ERROR for one of this connection's requests.
    func replied(requestID: UInt32, refused code: ErrorCode?, slot: Int) {
        if let special = specialRequests.removeValue(forKey: requestID) {
            switch special {
            case .pushMessage, .pushCall:
                if let code {
                    status.pushProbesRefused += 1
                    status.failures["push probe refused: \(code)", default: 0] += 1
                } else {
                    status.pushProbesAccepted += 1
                    if case .pushCall(let callID) = special {
                        // Nobody will answer: the call rang by push only; end it now.
                        specialRequests[nextRequestID] = .followUp
                        sendRequest(.callCancel(callID: callID), slot: slot)
                    }
                }
            case .followUp:
                // An error means the call had already ended (the callee's side ended it).
                if code != nil { status.unexpectedEvents += 1 }
            }
            return
        }
        switch layout.role(ofSlot: slot) {
        case .probeSender:
            if let code {
                status.probesRefused += 1
                status.failures["probe refused: \(code)", default: 0] += 1
            } else {
                status.probesAccepted += 1
            }
        case .fanoutSender:
            if let code {
                status.fanoutRefused += 1
                status.failures["fan-out message refused: \(code)", default: 0] += 1
            } else {
                status.fanoutAccepted += 1
            }
        case .idleDevice, .fanoutDevice:
            // Replies to CALL_REJECT. An error means the call had already ended.
            if code != nil { status.unexpectedEvents += 1 }
        }
    }
}
