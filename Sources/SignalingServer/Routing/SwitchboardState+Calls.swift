import SignalingProtocol
import SignalingSupport

/// The call state machine (docs/PROTOCOL.md 6.1). Each handler either changes state and
/// returns `.ok`, or changes nothing and returns the error the client gets.
extension SwitchboardState {
    typealias Reply = Result<Void, RequestError>

    mutating func invite(callID: String, callee: String, offer: [UInt8], from device: DeviceRecord, now: Instant) -> Reply {
        guard callee != device.userID else { return .failure(RequestError(.cannotCallSelf, "you cannot call yourself")) }
        if let existing = calls[callID], existing.caller === device {
            return .success(())  // a retry of an invite whose reply was lost: nothing changes
        }
        guard calls[callID] == nil else {
            return .failure(RequestError(.callIdInUse, "call id \(callID) is already in use; use a fresh (random) call id"))
        }
        if let refusal = admitSender(device.userID, bytes: offer.count, now: now) { return .failure(refusal) }
        let invitation = makeEvent(
            .callIncoming(callID: callID, caller: device.userID, callerDevice: device.deviceID, offer: offer, serverTime: currentWall))
        let call = CallRecord(callID: callID, caller: device, callee: callee, invitation: invitation, startedAt: now)
        counters.callsStarted += 1

        let calleeDevices = Array(devices(of: callee))
        let online = calleeDevices.filter(\.isOnline)
        let wakeable = calleeDevices.filter { device in
            guard !device.isOnline, let routing = pushRouting, let registrations = pushRegistrations[ObjectIdentifier(device)] else {
                return false
            }
            return routing.canWake(.call, registrations)
        }
        if online.isEmpty && wakeable.isEmpty {
            // Nobody to ring and nobody to wake: the caller learns at once.
            call.state = .ended(.unreachable)
            enqueue(callEnded(call, .unreachable, peer: callee), to: device)
            return .success(())
        }
        calls[callID] = call
        activity(device.userID).calls.append(call)
        activity(callee).calls.append(call)
        for target in online {
            call.rungDevices.append(target)
            enqueue(invitation, to: target)
        }
        // Offline devices are rung when they connect (see `attach`); wake them now.
        for target in wakeable { wakeUpOffline(target, .call) }
        scheduleRingTimeout(call, now: now)
        return .success(())
    }

    mutating func ringing(callID: String, from device: DeviceRecord) -> Reply {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .failure(error)
        }
        guard call.state.isUnanswered else { return .failure(illegal(call, "report ringing")) }
        if call.state == .inviting {
            call.state = .ringing
            enqueue(makeEvent(.callRang(callID: callID, device: device.deviceID)), to: call.caller)
        }
        return .success(())
    }

    mutating func accept(callID: String, answer: [UInt8], from device: DeviceRecord) -> Reply {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .failure(error)
        }
        guard call.state.isUnanswered else { return .failure(illegal(call, "accept")) }
        call.state = .active(answeredBy: device.deviceID)
        enqueue(
            makeEvent(.callAccepted(callID: callID, device: device.deviceID, answer: answer)),
            to: call.caller)
        notifyOtherCalleeDevices(of: call, except: device, reason: .answeredElsewhere)
        return .success(())
    }

    mutating func reject(callID: String, reason: CallEndReason, from device: DeviceRecord) -> Reply {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .failure(error)
        }
        guard call.state.isUnanswered else { return .failure(illegal(call, "reject")) }
        enqueue(callEnded(call, reason, peer: call.callee), to: call.caller)
        notifyOtherCalleeDevices(of: call, except: device, reason: .declinedElsewhere)
        end(call, reason)
        return .success(())
    }

    mutating func cancel(callID: String, from device: DeviceRecord) -> Reply {
        guard let call = calls[callID] else { return .failure(unknown(callID)) }
        guard call.caller === device else {
            return .failure(RequestError(.notCallParticipant, "only the calling device can cancel call \(callID)"))
        }
        guard call.state.isUnanswered else { return .failure(illegal(call, "cancel")) }
        notifyOtherCalleeDevices(of: call, except: nil, reason: .cancelled)
        end(call, .cancelled)
        return .success(())
    }

    mutating func hangUp(callID: String, from device: DeviceRecord) -> Reply {
        guard let call = calls[callID] else { return .failure(unknown(callID)) }
        let isCaller = call.caller === device
        guard isCaller || call.callee == device.userID else {
            return .failure(RequestError(.notCallParticipant, "you are not a party to call \(callID)"))
        }
        guard case .active(let answeredBy) = call.state else {
            return .failure(illegal(call, isCaller ? "hang up (use cancel before it is answered)" : "hang up (use reject)"))
        }
        if isCaller {
            if let answering = self.device(call.callee, answeredBy) {
                enqueue(callEnded(call, .hungUp, peer: device.userID), to: answering)
            }
        } else {
            guard device.deviceID == answeredBy else {
                return .failure(RequestError(.notCallParticipant, "call \(callID) was answered on device \(answeredBy)"))
            }
            enqueue(callEnded(call, .hungUp, peer: device.userID), to: call.caller)
        }
        end(call, .hungUp)
        return .success(())
    }

    // MARK: Server-generated endings

    /// The ring timeout passed with nobody answering: a missed call.
    mutating func ringTimedOut(_ call: CallRecord) {
        let reason: CallEndReason = call.rungDevices.isEmpty ? .unreachable : .noAnswer
        enqueue(callEnded(call, reason, peer: call.callee), to: call.caller)
        // Every device of the callee learns of the missed call, connected or not.
        for device in devices(of: call.callee) {
            enqueue(callEnded(call, .noAnswer, peer: call.caller.userID), to: device)
        }
        end(call, reason)
    }

    /// `device` lost its connection and did not come back within the grace period.
    mutating func partyVanished(_ call: CallRecord, _ device: DeviceRecord) {
        if call.caller === device {
            if case .active(let answeredBy) = call.state {
                if let answering = self.device(call.callee, answeredBy) {
                    enqueue(callEnded(call, .peerDisconnected, peer: device.userID), to: answering)
                }
            } else {
                notifyOtherCalleeDevices(of: call, except: nil, reason: .peerDisconnected)
            }
            end(call, .peerDisconnected)
            return
        }
        switch call.state {
        case .active(let answeredBy) where answeredBy == device.deviceID:
            enqueue(callEnded(call, .peerDisconnected, peer: call.callee), to: call.caller)
            end(call, .peerDisconnected)
        case .inviting, .ringing:
            // The callee is gone only when every device that was ringing is gone.
            guard !call.rungDevices.contains(where: \.isOnline) else { return }
            enqueue(callEnded(call, .peerDisconnected, peer: call.callee), to: call.caller)
            for rung in call.rungDevices { enqueue(callEnded(call, .noAnswer, peer: call.caller.userID), to: rung) }
            end(call, .peerDisconnected)
        default:
            return
        }
    }

    // MARK: Helpers

    private func callEnded(_ call: CallRecord, _ reason: CallEndReason, peer: String) -> QueuedEvent {
        makeEvent(.callEnded(callID: call.callID, reason: reason, peer: peer, serverTime: currentWall))
    }

    private mutating func notifyOtherCalleeDevices(of call: CallRecord, except device: DeviceRecord?, reason: CallEndReason) {
        let event = callEnded(call, reason, peer: call.caller.userID)
        for rung in call.rungDevices where rung !== device { enqueue(event, to: rung) }
    }

    private mutating func end(_ call: CallRecord, _ reason: CallEndReason) {
        call.state = .ended(reason)
        calls[call.callID] = nil
        for userID in [call.caller.userID, call.callee] {
            activities[userID]?.calls.removeAll { $0 === call }
            compactActivity(userID)
        }
    }

    private func lookUp(_ callID: String, calleeDevice device: DeviceRecord) -> Result<CallRecord, RequestError> {
        guard let call = calls[callID] else { return .failure(unknown(callID)) }
        guard call.callee == device.userID else {
            return .failure(RequestError(.notCallParticipant, "call \(callID) is not addressed to you"))
        }
        return .success(call)
    }

    private func unknown(_ callID: String) -> RequestError {
        RequestError(.unknownCall, "no live call with id \(callID)")
    }

    private func illegal(_ call: CallRecord, _ step: String) -> RequestError {
        let state: String
        switch call.state {
        case .inviting: state = "inviting"
        case .ringing: state = "ringing"
        case .active: state = "active"
        case .ended: state = "ended"
        }
        return RequestError(.illegalCallTransition, "cannot \(step): call \(call.callID) is \(state)")
    }
}

/// A request that failed: the ERROR frame's code and message.
struct RequestError: Error, Equatable {
    let code: ErrorCode
    let message: String

    init(_ code: ErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }
}
