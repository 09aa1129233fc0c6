import SignalingProtocol
import SignalingSupport

/// One call and where it is in its lifecycle. Lives in the callee's shard and is guarded by
/// that shard's lock; the caller's shard knows the call as an `OutgoingCall`.
final class CallRecord: @unchecked Sendable {
    /// The call lifecycle (docs/PROTOCOL.md 6.1).
    enum State: Equatable {
        /// CALL_INVITE accepted; CALL_INCOMING queued to the callee's devices; nobody
        /// has rung yet.
        case inviting
        /// At least one callee device reported CALL_RINGING.
        case ringing
        /// A callee device accepted; the call is bound to that device.
        case active(answeredBy: String)
        /// Over; the record is about to be dropped.
        case ended(CallEndReason)

        var isUnanswered: Bool { self == .inviting || self == .ringing }
    }

    let callID: String
    /// The calling device, by its ids: it may be another shard's.
    let caller: DeviceAddress
    let callee: String
    /// CALL_INCOMING, kept so a callee device that connects while the call rings is rung too.
    let invitation: QueuedEvent
    let startedAt: Instant
    var state: State = .inviting
    /// Callee devices that were sent CALL_INCOMING, in the order they were rung
    /// (`markRung`).
    private(set) var rungDevices: [DeviceRecord] = []
    /// The same devices, to tell in O(1) whether one was rung (a device that connects
    /// during the ring, `ringIfCalled`; a device's disconnect, `involves`), where a walk of
    /// `rungDevices` grew with the callee's devices. The records are kept alive by
    /// `rungDevices`, so no identifier is reused while it is here.
    private var rung: Set<ObjectIdentifier> = []
    /// How many of `rungDevices` are connected while the call is unanswered (a device is
    /// rung only while connected, `markRung`; its connects and disconnects since are counted
    /// by `rungDeviceConnected` and `rungDeviceDisconnected`), so that a grace check asks in
    /// O(1) whether any rung device is still there, where a walk of `rungDevices` grew with
    /// the callee's devices (each of 1,000 devices' checks walked them all once every device
    /// had gone). Not kept once the call is answered: nothing reads it then.
    private(set) var connectedRung = 0
    /// Callee devices connected when the call reached the callee's shard and not rung yet:
    /// a hold rings at most a chunk of them (`fanOutChunk`), `ShardStep.continueRing` the
    /// rest, while the call is unanswered (`SwitchboardState.ringChunk`). One rung meanwhile
    /// (it connected again) stays here and is skipped by its chunk (`markRung`).
    var toRing: ArraySlice<DeviceRecord> = []
    /// The number of the last notice sent to the caller's shard (`ShardStep.toCaller`).
    private(set) var noticesToCaller: UInt32 = 0
    /// For each callee device that lost its connection during the call, when the grace of
    /// its latest loss ends. A grace check acts only if its deadline is still the one kept
    /// here: after a resume and a second loss, the first loss's check must not end the call.
    /// By the record's identity, with the record (which keeps the identity from being
    /// reused while it is here): a look-up per check, where a list walked per check grew
    /// with the devices that had lost their connection.
    private var graceDeadlines: [ObjectIdentifier: (device: DeviceRecord, deadline: Instant)] = [:]

    init(callID: String, caller: DeviceAddress, callee: String, invitation: QueuedEvent, startedAt: Instant) {
        self.callID = callID
        self.caller = caller
        self.callee = callee
        self.invitation = invitation
        self.startedAt = startedAt
    }

    /// Records that `device`, connected, is rung; false if it already was (it must not be
    /// rung twice).
    func markRung(_ device: DeviceRecord) -> Bool {
        assert(device.isOnline, "a call rings connected devices only")
        guard rung.insert(ObjectIdentifier(device)).inserted else { return false }
        rungDevices.append(device)
        connectedRung += 1
        return true
    }

    /// `device`, of the callee, connected again (it had no connection) while the call is
    /// unanswered.
    func rungDeviceConnected(_ device: DeviceRecord) {
        if wasRung(device) { connectedRung += 1 }
    }

    /// `device`, of the callee, lost its connection while the call is unanswered.
    func rungDeviceDisconnected(_ device: DeviceRecord) {
        if wasRung(device) { connectedRung -= 1 }
    }

    func wasRung(_ device: DeviceRecord) -> Bool { rung.contains(ObjectIdentifier(device)) }

    /// The number of the next notice to the caller's shard.
    func nextNoticeNumber() -> UInt32 {
        noticesToCaller += 1
        return noticesToCaller
    }

    func graceDeadline(of device: DeviceRecord) -> Instant? {
        graceDeadlines[ObjectIdentifier(device)]?.deadline
    }

    func setGraceDeadline(_ deadline: Instant, of device: DeviceRecord) {
        graceDeadlines[ObjectIdentifier(device)] = (device, deadline)
    }

    var isLive: Bool {
        if case .ended = state { return false }
        return true
    }
}

/// A call placed by a device of this shard's user, as the caller's shard knows it: enough to
/// find the call in the callee's shard (which holds its state) and to end it if the calling
/// device stays away. Guarded by the caller's shard's lock; gone when the call ends
/// (`CallerNotice.closed`).
final class OutgoingCall: @unchecked Sendable {
    let callID: String
    let callee: String
    let device: DeviceRecord
    /// When the grace of the calling device's latest loss of its connection ends: a grace
    /// check acts only if its deadline is still this one.
    var graceDeadline: Instant?
    /// The number of the callee's shard's next notice to apply; notices that arrive before
    /// it wait in `earlyNotices` (at most the few a call makes).
    var nextNotice: UInt32 = 1
    var earlyNotices: [(number: UInt32, notice: CallerNotice)] = []

    init(callID: String, callee: String, device: DeviceRecord) {
        self.callID = callID
        self.callee = callee
        self.device = device
    }
}
