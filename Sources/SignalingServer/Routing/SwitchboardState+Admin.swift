import SignalingProtocol
import SignalingStore
import SignalingSupport

/// One device of a user as the admin API shows it (`GET /v1/users/{id}/devices`).
struct DevicePresence: Sendable, Equatable {
    let deviceID: String
    let online: Bool
    /// Wall-clock ms: now for an online device, else when its last connection ended.
    let lastSeen: UInt64
    /// Unacknowledged events in its queue.
    let pendingEvents: Int
}

/// Why an admin operation changed nothing.
enum AdminRefusal: Error, Equatable {
    case unknownUser(String)
    case unknownDevice(user: String, device: String)
}

/// The operations of the admin API's backend endpoints (docs/ADMIN-API.md). Each one runs
/// under the switchboard lock as a whole, after checking everything it needs, so it is
/// either applied entirely or refused with nothing changed; its store changes form one
/// commit unit.
extension SwitchboardState {
    /// Whether the server knows `userID`: a device, or messages held for it.
    func knows(_ userID: String) -> Bool {
        users[userID] != nil || !(activities[userID]?.held.isEmpty ?? true)
    }

    /// The user's devices, newest first (nil: the server knows no device of this user).
    func presence(of userID: String, now: Instant) -> [DevicePresence]? {
        guard users[userID] != nil else { return nil }
        let nowSecond = second(now)
        return devices(of: userID).map { device in
            let away = device.isOnline ? 0 : UInt64(nowSecond &- min(device.disconnectedSecond, nowSecond))
            return DevicePresence(
                deviceID: device.deviceID, online: device.isOnline, lastSeen: currentWall &- min(away * 1000, currentWall),
                pendingEvents: device.queue.count)
        }
    }

    /// Gives the device a new session id, so that no connection can resume the old one,
    /// and closes its live connection (CLOSE sessionUnknown, action fresh): the device must
    /// start a new session. Its pending events stay and go to the new session.
    mutating func revokeSession(
        user userID: String, device deviceID: String, into effects: inout [SwitchboardEffect]
    ) -> Result<Void, AdminRefusal> {
        guard users[userID] != nil else { return .failure(.unknownUser(userID)) }
        guard let device = device(userID, deviceID) else { return .failure(.unknownDevice(user: userID, device: deviceID)) }
        var random = FastRandom()
        device.sessionID = SessionID.random(using: &random)
        journal(.upsertDevice(user: userID, device: deviceID, sessionID: device.sessionID, lastSeen: currentWall))
        if let connection = device.connection {
            effects.append(.close(connection, Close(
                code: .sessionUnknown, message: "the operator revoked this session; start a new session")))
        }
        return .success(())
    }

    /// Forgets a user: every device (closed with CLOSE sessionUnknown if connected) with
    /// its queue and push registration, the messages held for it, the ids of the messages
    /// it sent, and the calls it takes part in (ended at once for the other party with
    /// peerDisconnected, as if its device had vanished and its grace had passed). Returns
    /// the number of devices removed, and the steps that end its calls in other shards.
    /// Messages it sent that wait in other users' queues stay theirs.
    mutating func forgetUser(
        _ userID: String, now: Instant, into effects: inout [SwitchboardEffect]
    ) -> (Result<Int, AdminRefusal>, next: [ShardStep]) {
        guard knows(userID) else { return (.failure(.unknownUser(userID)), []) }
        let removed = Array(devices(of: userID))
        // Every connection goes first, so that nothing below sees one of the user's devices
        // still connected. (The calls were once checked device by device before the
        // device's connection was cleared: a call ringing a connected device found it
        // there, and rang on until its timeout for a callee who no longer existed.)
        for device in removed {
            guard let connection = device.connection else { continue }
            effects.append(.close(connection, Close(
                code: .sessionUnknown, message: "the operator removed this user; start a new session")))
            // The connection's loop detaches nothing when it closes: the record is gone.
            for call in activities[userID]?.calls ?? [] where call.isLive && call.state.isUnanswered {
                call.rungDeviceDisconnected(device)
            }
            device.connection = nil
        }
        var ended = StepOutcome(reply: nil)
        // Calls to the user: nobody is left to answer, whatever its devices were doing
        // (ringing, still to be rung in a later chunk, woken by push, or in their grace).
        for call in activities[userID]?.calls ?? [] where call.isLive {
            ended.merge(calleeVanished(call, missedBy: [], into: &effects))
        }
        // Calls from the user: their callees' devices are told in the callees' shards.
        for device in removed { ended.merge(callerGone(device, into: &effects)) }
        for device in removed {
            removeDevice(device)
            journal(.removeDevice(user: userID, device: device.deviceID))
        }
        if let activity = activities[userID] {
            if !activity.held.isEmpty {
                stopTrackingShares(of: .held(userID), events: activity.forEachHeld)
                counters.pendingEvents -= activity.heldEventCount
                journal(.releaseHeld(user: userID, through: activity.nextHeldOrdinal - 1))
                activity.firstHeldOrdinal = activity.nextHeldOrdinal
                activity.held = []
            }
            for messageID in Array(activity.recentMessageIDs.keys) { forgetMessageID(messageID, sender: userID) }
            // Every device they were for is gone.
            activity.broadcasts.forEach { broadcasts[$0.id] = nil }
            activity.broadcasts = FIFOQueue()
            compactActivity(userID)
        }
        return (.success(removed.count), ended.next)
    }
}
