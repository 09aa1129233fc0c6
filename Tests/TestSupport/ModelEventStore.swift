import SignalingProtocol
import SignalingStore
import Synchronization

/// An `EventStore` kept in memory, for tests: it applies changes with the documented
/// semantics (a reference model of the SQLite store), survives "restarts" of a server in
/// the same process, counts commits, and can be told to fail like a full disk.
public final class ModelEventStore: EventStore {
    private struct State {
        var devices: [String: StoredDevice] = [:]
        var held: [String: [StoredEvent]] = [:]
        var messageIDs: [String: StoredMessageID] = [:]
        var failure: StoreError?
        var batches = 0
        var failedAttempts = 0
    }
    private let state = Mutex(State())

    public init() {}

    private static func key(_ user: String, _ device: String) -> String { user + "\u{1F}" + device }

    /// While set, every `apply` fails with this error and changes nothing.
    public func failCommits(with error: StoreError?) {
        state.withLock { $0.failure = error }
    }

    public var committedBatches: Int { state.withLock { $0.batches } }
    public var failedAttempts: Int { state.withLock { $0.failedAttempts } }

    public func loadSnapshot() throws(StoreError) -> StoredSnapshot {
        state.withLock { state in
            StoredSnapshot(
                devices: state.devices.values.sorted { ($0.userID, $0.deviceID) < ($1.userID, $1.deviceID) },
                held: state.held.filter { !$0.value.isEmpty },
                messageIDs: Array(state.messageIDs.values))
        }
    }

    /// Every event currently stored for a device.
    public func events(user: String, device: String) -> [StoredEvent] {
        state.withLock { $0.devices[Self.key(user, device)]?.events ?? [] }
    }

    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        let failure: StoreError? = state.withLock { state in
            if let failure = state.failure {
                state.failedAttempts += 1
                return failure
            }
            var copy = state
            for change in changes { Self.apply(change, to: &copy) }
            copy.batches += 1
            state = copy
            return nil
        }
        if let failure { throw failure }
    }

    private static func apply(_ change: StoreChange, to state: inout State) {
        switch change {
        case .upsertDevice(let user, let device, let sessionID, let lastSeen):
            let key = key(user, device)
            if state.devices[key] == nil {
                state.devices[key] = StoredDevice(
                    userID: user, deviceID: device, sessionID: sessionID, ackedSeq: 0, lastSeq: 0, lastSeen: lastSeen)
            } else {
                state.devices[key]!.sessionID = sessionID
                state.devices[key]!.lastSeen = lastSeen
            }
        case .appendEvent(let user, let device, let event):
            let key = key(user, device)
            precondition(state.devices[key] != nil, "appendEvent before upsertDevice")
            state.devices[key]!.events.append(event)
            state.devices[key]!.lastSeq = max(state.devices[key]!.lastSeq, event.seq)
        case .acknowledge(let user, let device, let through):
            let key = key(user, device)
            guard state.devices[key] != nil else { return }
            state.devices[key]!.events.removeAll { $0.seq <= through }
            state.devices[key]!.ackedSeq = max(state.devices[key]!.ackedSeq, through)
            state.devices[key]!.lastSeq = max(state.devices[key]!.lastSeq, through)
        case .removeDevice(let user, let device):
            state.devices[key(user, device)] = nil
        case .holdForUser(let user, let event):
            state.held[user, default: []].append(event)
        case .releaseHeld(let user, let through):
            state.held[user]?.removeAll { $0.seq <= through }
        case .rememberMessageID(let id):
            state.messageIDs[key(id.sender, id.messageID)] = id
        case .forgetMessageID(let sender, let messageID):
            state.messageIDs[key(sender, messageID)] = nil
        case .registerPush(let user, let device, let registration):
            state.devices[key(user, device)]?.push = registration
        }
    }

    public func close() {}
}
