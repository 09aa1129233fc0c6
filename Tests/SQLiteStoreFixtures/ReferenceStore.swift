import SignalingProtocol
import SignalingStore

/// What a correct store holds after a sequence of batches, computed in memory from the
/// documented meaning of each `StoreChange`. Tests compare a real store's snapshot with it.
/// Its snapshot is in every store's order (`StoredSnapshot.sort`).
public struct ReferenceStore: Sendable {
    private var devices: [DeviceKey: StoredDevice] = [:]
    private var held: [String: [StoredEvent]] = [:]
    private var messageIDs: [StoredMessageKey: StoredMessageID] = [:]

    public init() {}

    public mutating func apply(_ changes: [StoreChange]) {
        for change in changes { apply(change) }
    }

    public mutating func apply(_ change: StoreChange) {
        switch change {
        case .upsertDevice(let user, let device, let sessionID, let lastSeen):
            let key = DeviceKey(userID: user, deviceID: device)
            if devices[key] == nil {
                devices[key] = StoredDevice(userID: user, deviceID: device, sessionID: sessionID,
                                            lastSeq: 0, lastSeen: lastSeen)
            } else {
                devices[key]!.sessionID = sessionID
                devices[key]!.lastSeen = lastSeen
            }
        case .appendEvent(let user, let device, let event):
            let key = DeviceKey(userID: user, deviceID: device)
            guard devices[key] != nil else { return }
            devices[key]!.lastSeq = max(devices[key]!.lastSeq, event.seq)
            Self.insertInOrder(event, into: &devices[key]!.events)
        case .claimHeldEvent(let user, let device, let seq, let ordinal):
            let key = DeviceKey(userID: user, deviceID: device)
            guard devices[key] != nil else { return }
            devices[key]!.lastSeq = max(devices[key]!.lastSeq, seq)
            guard let held = held[user]?.first(where: { $0.seq == ordinal }) else { return }
            Self.insertInOrder(
                StoredEvent(seq: seq, type: held.type, body: held.body, receipt: held.receipt, createdAt: held.createdAt),
                into: &devices[key]!.events)
        case .acknowledge(let user, let device, let through):
            let key = DeviceKey(userID: user, deviceID: device)
            guard devices[key] != nil else { return }
            devices[key]!.events.removeAll { $0.seq <= through }
            devices[key]!.lastSeq = max(devices[key]!.lastSeq, through)
        case .reserveSequence(let user, let device, let through):
            let key = DeviceKey(userID: user, deviceID: device)
            guard devices[key] != nil else { return }
            devices[key]!.lastSeq = max(devices[key]!.lastSeq, through)
        case .removeDevice(let user, let device):
            devices[DeviceKey(userID: user, deviceID: device)] = nil
        case .holdForUser(let user, let event):
            Self.insertInOrder(event, into: &held[user, default: []])
        case .releaseHeld(let user, let through):
            held[user]?.removeAll { $0.seq <= through }
            if held[user]?.isEmpty == true { held[user] = nil }
        case .rememberMessageID(let remembered):
            messageIDs[StoredMessageKey(sender: remembered.sender, messageID: remembered.messageID)] = remembered
        case .forgetMessageID(let sender, let messageID, let serverTime):
            // Only the record remembered with that server time (`StoreChange.forgetMessageID`).
            let key = StoredMessageKey(sender: sender, messageID: messageID)
            if messageIDs[key]?.serverTime == serverTime { messageIDs[key] = nil }
        case .registerPush(let user, let device, let registration):
            devices[DeviceKey(userID: user, deviceID: device)]?.pushRegistrations.register(registration)
        case .removePush(let user, let device, let kind):
            devices[DeviceKey(userID: user, deviceID: device)]?.pushRegistrations.unregister(kind)
        case .withdrawEvent(let user, let device, let seq):
            let key = DeviceKey(userID: user, deviceID: device)
            guard devices[key] != nil else { return }
            devices[key]!.events.removeAll { $0.seq == seq }
            devices[key]!.lastSeq = max(devices[key]!.lastSeq, seq)
        case .withdrawHeld(let user, let ordinal):
            held[user]?.removeAll { $0.seq == ordinal }
            if held[user]?.isEmpty == true { held[user] = nil }
        }
    }

    public var snapshot: StoredSnapshot {
        var snapshot = StoredSnapshot(devices: Array(devices.values), held: held, messageIDs: Array(messageIDs.values))
        snapshot.sort()
        return snapshot
    }

    private static func insertInOrder(_ event: StoredEvent, into events: inout [StoredEvent]) {
        let index = events.lastIndex { $0.seq < event.seq }.map { $0 + 1 } ?? 0
        events.insert(event, at: index)
    }
}
