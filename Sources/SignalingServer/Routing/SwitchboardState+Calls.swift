import SignalingProtocol
import SignalingSupport

/// The call state machine (docs/PROTOCOL.md 6.1). Each request either changes state and
/// answers OK, or changes nothing and answers with the error the client gets.
///
/// A call lives in the callee's shard (`CallRecord`): every callee device's request, the
/// ring timeout and the callee devices' grace checks run there, so "first accept wins"
/// is decided in one place. The caller's shard keeps an `OutgoingCall` to find the call
/// and to notice the calling device staying away; what the calling device asks (cancel,
/// hang up) and what it is told (rang, accepted, ended) are steps between the two
/// (`ShardStep`), run at once when both users are in the same shard.
extension SwitchboardState {
    typealias Reply = Result<Void, RequestError>

    mutating func invite(
        callID: String, callee: String, offer: [UInt8], from device: DeviceRecord, now: Instant, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        assertOwns(device)
        guard callee != device.userID else { return .answered(.failure(RequestError(.cannotCallSelf, "you cannot call yourself"))) }
        if let existing = outgoingCall(callID, of: device.userID) {
            // A retry of an invite whose reply was lost: nothing changes.
            guard existing.device !== device else { return .answered(.success(currentWall)) }
            return .answered(.failure(callIDInUse(callID)))
        }
        if let refusal = admitSender(device.userID, bytes: offer.count, now: now) { return .answered(.failure(refusal)) }
        guard callDirectory.claim(callID) else { return .answered(.failure(callIDInUse(callID))) }
        activity(device.userID).outgoingCalls.append(OutgoingCall(callID: callID, callee: callee, device: device))
        return handOn(.invite(CallInvitation(callID: callID, caller: DeviceAddress(device), callee: callee, offer: offer)), now: now,
            into: &effects)
    }

    /// The callee's step of an invite: rings the callee's devices, or ends the call at once
    /// when there is nobody to ring or wake.
    mutating func ring(_ invitation: CallInvitation, now: Instant, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        // The id was claimed in the directory by the caller's shard: no other call has it.
        let callID = invitation.callID, callee = invitation.callee
        let invitationEvent = makeEvent(.callIncoming(
            callID: callID, caller: invitation.caller.user, callerDevice: invitation.caller.device, offer: invitation.offer,
            serverTime: currentWall))
        let call = CallRecord(callID: callID, caller: invitation.caller, callee: callee, invitation: invitationEvent, startedAt: now)
        counters.callsStarted += 1

        let calleeDevices = Array(devices(of: callee))
        let online = calleeDevices.filter(\.isOnline)
        let wakeable = calleeDevices.filter { device in
            guard !device.isOnline, let routing = pushRouting, let registrations = pushRegistrations[ObjectIdentifier(device)] else {
                return false
            }
            return routing.canWake(.call, registrations)
        }
        var outcome = StepOutcome.answered(.success(currentWall))
        if online.isEmpty && wakeable.isEmpty {
            // Nobody to ring and nobody to wake: the caller learns at once.
            call.state = .ended(.unreachable)
            callDirectory.release(callID)
            outcome.merge(toCaller(call, callEnded(call, .unreachable, peer: callee), into: &effects))
            outcome.merge(toCaller(call, .closed, into: &effects))
            return outcome
        }
        calls[callID] = call
        activity(callee).calls.append(call)
        call.toRing = online[...]
        // Offline devices are rung when they connect (see `attach`); wake them now.
        for target in wakeable { wakeUpOffline(target, .call, into: &effects) }
        scheduleRingTimeout(call, now: now)
        outcome.next += ringChunk(call, into: &effects)
        return outcome
    }

    /// Rings the next chunk of the devices the call still has to ring (`CallRecord.toRing`),
    /// if it is still unanswered; returns the step for the rest (none: done, or answered,
    /// cancelled or ended meanwhile: the rest is never rung). A device that lost its
    /// connection meanwhile (or was forgotten) is skipped, rung when it connects again;
    /// one rung meanwhile because it connected again (`ringIfCalled`) is not rung twice.
    mutating func ringChunk(_ call: CallRecord, into effects: inout [SwitchboardEffect]) -> [ShardStep] {
        guard call.isLive, call.state.isUnanswered else {
            call.toRing = []
            return []
        }
        let end = min(call.toRing.endIndex, call.toRing.startIndex + configuration.fanOutChunk)
        // A device rung meanwhile (it connected again, `ringIfCalled`) is not rung twice.
        for target in call.toRing[..<end] where target.isOnline && call.markRung(target) {
            enqueue(call.invitation, to: target, into: &effects)
        }
        call.toRing = call.toRing[end...]
        guard call.toRing.isEmpty else { return [.continueRing(callee: call.callee, callID: call.callID)] }
        call.toRing = []  // frees the slice's buffer
        return []
    }

    /// The next chunk of call `callID`'s ringing (nothing if the call is gone).
    mutating func continueRing(callee: String, callID: String, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard let call = calls[callID], call.callee == callee else { return StepOutcome(reply: nil) }
        return StepOutcome(reply: nil, next: ringChunk(call, into: &effects))
    }

    mutating func ringing(callID: String, from device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .answered(.failure(error))
        }
        guard call.state.isUnanswered else { return .answered(.failure(illegal(call, "report ringing"))) }
        var outcome = StepOutcome.answered(.success(currentWall))
        if call.state == .inviting {
            call.state = .ringing
            outcome.merge(toCaller(call, .callRang(callID: callID, device: device.deviceID), into: &effects))
        }
        return outcome
    }

    mutating func accept(
        callID: String, answer: [UInt8], from device: DeviceRecord, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .answered(.failure(error))
        }
        guard call.state.isUnanswered else { return .answered(.failure(illegal(call, "accept"))) }
        call.state = .active(answeredBy: device.deviceID)
        var outcome = StepOutcome.answered(.success(currentWall))
        outcome.merge(toCaller(call, .callAccepted(callID: callID, device: device.deviceID, answer: answer), into: &effects))
        outcome.next += notifyOtherCalleeDevices(of: call, except: device, reason: .answeredElsewhere, into: &effects)
        return outcome
    }

    mutating func reject(
        callID: String, reason: CallEndReason, from device: DeviceRecord, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        let call: CallRecord
        switch lookUp(callID, calleeDevice: device) {
        case .success(let found): call = found
        case .failure(let error): return .answered(.failure(error))
        }
        guard call.state.isUnanswered else { return .answered(.failure(illegal(call, "reject"))) }
        var outcome = StepOutcome.answered(.success(currentWall))
        outcome.merge(toCaller(call, callEnded(call, reason, peer: call.callee), into: &effects))
        outcome.next += notifyOtherCalleeDevices(of: call, except: device, reason: .declinedElsewhere, into: &effects)
        outcome.merge(end(call, reason, into: &effects))
        return outcome
    }

    mutating func cancel(callID: String, from device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard let outgoing = outgoingCall(callID, of: device.userID) else {
            guard callDirectory.contains(callID) else { return .answered(.failure(unknown(callID))) }
            return .answered(.failure(notCaller(callID)))
        }
        guard outgoing.device === device else { return .answered(.failure(notCaller(callID))) }
        return handOn(.callerRequest(.cancel, callID: callID, callee: outgoing.callee, caller: DeviceAddress(device)), into: &effects)
    }

    mutating func hangUp(callID: String, from device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        if let outgoing = outgoingCall(callID, of: device.userID) {
            guard outgoing.device === device else { return .answered(.failure(notParty(callID))) }
            return handOn(.callerRequest(.hangUp, callID: callID, callee: outgoing.callee, caller: DeviceAddress(device)), into: &effects)
        }
        // Another shard's call (or one to another user of this shard): not this device's.
        guard let call = calls[callID], call.callee == device.userID else {
            return .answered(.failure(callDirectory.contains(callID) ? notParty(callID) : unknown(callID)))
        }
        guard case .active(let answeredBy) = call.state else { return .answered(.failure(illegal(call, "hang up (use reject)"))) }
        guard device.deviceID == answeredBy else {
            return .answered(.failure(RequestError(.notCallParticipant, "call \(callID) was answered on device \(answeredBy)")))
        }
        var outcome = StepOutcome.answered(.success(currentWall))
        outcome.merge(toCaller(call, callEnded(call, .hungUp, peer: device.userID), into: &effects))
        outcome.merge(end(call, .hungUp, into: &effects))
        return outcome
    }

    /// The callee's step of a cancel or hang-up from the calling device.
    mutating func callerAsked(
        _ request: CallerRequest, callID: String, caller: DeviceAddress, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        guard let call = calls[callID], call.caller == caller else { return .answered(.failure(unknown(callID))) }
        switch request {
        case .cancel:
            guard call.state.isUnanswered else { return .answered(.failure(illegal(call, "cancel"))) }
            let ending = notifyOtherCalleeDevices(of: call, except: nil, reason: .cancelled, into: &effects)
            return .answered(.success(currentWall), next: ending + end(call, .cancelled, into: &effects).next)
        case .hangUp:
            guard case .active(let answeredBy) = call.state else {
                return .answered(.failure(illegal(call, "hang up (use cancel before it is answered)")))
            }
            if let answering = self.device(call.callee, answeredBy) {
                enqueue(callEnded(call, .hungUp, peer: caller.user), to: answering, into: &effects)
            }
            return .answered(.success(currentWall), next: end(call, .hungUp, into: &effects).next)
        }
    }

    // MARK: Server-generated endings

    /// The ring timeout passed with nobody answering: a missed call.
    mutating func ringTimedOut(_ call: CallRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        let reason: CallEndReason = call.rungDevices.isEmpty ? .unreachable : .noAnswer
        var outcome = toCaller(call, callEnded(call, reason, peer: call.callee), into: &effects)
        // Every device of the callee learns of the missed call, connected or not (a chunk
        // a hold: `DeviceBroadcast`).
        let missed = makeEvent(callEnded(call, .noAnswer, peer: call.caller.user))
        outcome.next += broadcastToEveryDevice(missed, of: call.callee, into: &effects)
        outcome.merge(end(call, reason, into: &effects))
        return outcome
    }

    /// The callee's `device` lost its connection and did not come back within the grace
    /// period.
    mutating func partyVanished(_ call: CallRecord, _ device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        switch call.state {
        case .active(let answeredBy) where answeredBy == device.deviceID:
            return calleeVanished(call, missedBy: [], into: &effects)
        case .inviting, .ringing:
            // The callee is gone only when every device that was ringing, or is still to
            // be rung, is gone: a count for the rung ones (O(1)); those still to be rung
            // are a walk, but their chunks are rung within microseconds of the invite, so
            // a check, seconds after a loss, finds none.
            assert(call.connectedRung == call.rungDevices.count(where: \.isOnline), "connected rung devices miscounted")
            guard call.connectedRung == 0 && !call.toRing.contains(where: \.isOnline) else {
                return StepOutcome(reply: nil)
            }
            return calleeVanished(call, missedBy: call.rungDevices, into: &effects)
        default:
            return StepOutcome(reply: nil)
        }
    }

    /// The callee of the live `call` is gone (the devices that rang, or the one that
    /// answered, stayed away past their grace; or the operator forgot the user): CALL_ENDED
    /// peerDisconnected to the caller, noAnswer (a missed call) to `missedBy`, and the call
    /// ends. `missedBy` is empty when there is nobody to tell (an answered call, a user
    /// forgotten: its devices are being removed).
    mutating func calleeVanished(_ call: CallRecord, missedBy: [DeviceRecord], into effects: inout [SwitchboardEffect]) -> StepOutcome {
        var outcome = toCaller(call, callEnded(call, .peerDisconnected, peer: call.callee), into: &effects)
        if !missedBy.isEmpty {
            let missed = makeEvent(callEnded(call, .noAnswer, peer: call.caller.user))
            outcome.next += broadcast(missed, to: missedBy, of: call.callee, into: &effects)
        }
        outcome.merge(end(call, .peerDisconnected, into: &effects))
        return outcome
    }

    /// The calling device stayed away past its grace period (or its user was forgotten:
    /// `callerGone`): the callee's step, which ends the call for the callee's devices.
    mutating func callerVanished(callID: String, caller: DeviceAddress, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard let call = calls[callID], call.caller == caller, call.isLive else { return StepOutcome(reply: nil) }
        var ending: [ShardStep] = []
        if case .active(let answeredBy) = call.state {
            if let answering = self.device(call.callee, answeredBy) {
                enqueue(callEnded(call, .peerDisconnected, peer: caller.user), to: answering, into: &effects)
            }
        } else {
            ending = notifyOtherCalleeDevices(of: call, except: nil, reason: .peerDisconnected, into: &effects)
        }
        var outcome = end(call, .peerDisconnected, into: &effects)
        outcome.next = ending + outcome.next
        return outcome
    }

    /// The calling device `device` is gone for good: the steps that end its calls.
    mutating func callerGone(_ device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        var outcome = StepOutcome(reply: nil)
        for outgoing in activities[device.userID]?.outgoingCalls ?? [] where outgoing.device === device {
            outcome.merge(handOn(.callerVanished(callID: outgoing.callID, callee: outgoing.callee, caller: DeviceAddress(device)),
                into: &effects))
        }
        return outcome
    }

    /// The caller's shard forgets a call that ended (or was refused).
    mutating func forgetOutgoingCall(_ callID: String, of caller: DeviceAddress) {
        guard let activity = activities[caller.user] else { return }
        activity.outgoingCalls.removeAll { $0.callID == callID && caller.names($0.device) }
        compactActivity(caller.user)
    }

    // MARK: Helpers

    private func outgoingCall(_ callID: String, of userID: String) -> OutgoingCall? {
        activities[userID]?.outgoingCalls.first { $0.callID == callID }
    }

    /// Tells the calling device `event` (a step when it is another shard's).
    private mutating func toCaller(_ call: CallRecord, _ event: Event, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        toCaller(call, .event(event), into: &effects)
    }

    private mutating func toCaller(_ call: CallRecord, _ notice: CallerNotice, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        handOn(.toCaller(notice, callID: call.callID, caller: call.caller, number: call.nextNoticeNumber()), into: &effects)
    }

    /// The caller's step of a notice from the callee's shard: applied in the order they
    /// were numbered (one that overtook an earlier one waits for it).
    mutating func receive(
        _ notice: CallerNotice, callID: String, caller: DeviceAddress, number: UInt32, into effects: inout [SwitchboardEffect]
    ) {
        guard let outgoing = activities[caller.user]?.outgoingCalls.first(where: { $0.callID == callID && caller.names($0.device) }) else {
            // The call is no longer known here (its caller was forgotten): nothing to order.
            apply(notice, callID: callID, caller: caller, into: &effects)
            return
        }
        guard number == outgoing.nextNotice else {
            outgoing.earlyNotices.append((number, notice))
            return
        }
        apply(notice, callID: callID, caller: caller, into: &effects)
        outgoing.nextNotice += 1
        while let index = outgoing.earlyNotices.firstIndex(where: { $0.number == outgoing.nextNotice }) {
            apply(outgoing.earlyNotices.remove(at: index).notice, callID: callID, caller: caller, into: &effects)
            outgoing.nextNotice += 1
        }
    }

    private mutating func apply(_ notice: CallerNotice, callID: String, caller: DeviceAddress, into effects: inout [SwitchboardEffect]) {
        switch notice {
        case .event(let event):
            if let device = device(caller.user, caller.device) { enqueue(event, to: device, into: &effects) }
        case .closed:
            forgetOutgoingCall(callID, of: caller)
        }
    }

    private func callEnded(_ call: CallRecord, _ reason: CallEndReason, peer: String) -> Event {
        .callEnded(callID: call.callID, reason: reason, peer: peer, serverTime: currentWall)
    }

    private mutating func enqueue(_ event: Event, to device: DeviceRecord, into effects: inout [SwitchboardEffect]) {
        enqueue(makeEvent(event), to: device, into: &effects)
    }

    /// CALL_ENDED `reason` to every rung device of the call but `device`, a chunk a hold
    /// (`DeviceBroadcast`); returns the step for the chunks after the first.
    private mutating func notifyOtherCalleeDevices(
        of call: CallRecord, except device: DeviceRecord?, reason: CallEndReason, into effects: inout [SwitchboardEffect]
    ) -> [ShardStep] {
        let event = makeEvent(callEnded(call, reason, peer: call.caller.user))
        return broadcast(event, to: call.rungDevices, of: call.callee, skipping: device, into: &effects)
    }

    /// Drops a call from the callee's shard; the caller's shard forgets it in the step
    /// returned (its last notice).
    private mutating func end(_ call: CallRecord, _ reason: CallEndReason, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        call.state = .ended(reason)
        calls[call.callID] = nil
        callDirectory.release(call.callID)
        activities[call.callee]?.calls.removeAll { $0 === call }
        compactActivity(call.callee)
        return toCaller(call, .closed, into: &effects)
    }

    private func lookUp(_ callID: String, calleeDevice device: DeviceRecord) -> Result<CallRecord, RequestError> {
        guard let call = calls[callID], call.callee == device.userID else {
            // Another shard's call (or one to another user of this shard).
            guard callDirectory.contains(callID) else { return .failure(unknown(callID)) }
            return .failure(RequestError(.notCallParticipant, "call \(callID) is not addressed to you"))
        }
        return .success(call)
    }

    private func unknown(_ callID: String) -> RequestError {
        RequestError(.unknownCall, "no live call with id \(callID)")
    }

    private func callIDInUse(_ callID: String) -> RequestError {
        RequestError(.callIdInUse, "call id \(callID) is already in use; use a fresh (random) call id")
    }

    private func notCaller(_ callID: String) -> RequestError {
        RequestError(.notCallParticipant, "only the calling device can cancel call \(callID)")
    }

    private func notParty(_ callID: String) -> RequestError {
        RequestError(.notCallParticipant, "you are not a party to call \(callID)")
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
