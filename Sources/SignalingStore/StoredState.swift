import SignalingProtocol

/// Identifies a device across users (device ids are only unique within a user): the key
/// of every per-device table, in the store and in memory.
public struct DeviceKey: Hashable, Sendable {
    public var userID: String
    public var deviceID: String

    public init(userID: String, deviceID: String) {
        self.userID = userID
        self.deviceID = deviceID
    }
}

/// One event as stored: for a device (with its sequence number) or held for a user that
/// has no device yet (with an ordinal that orders the held events).
public struct StoredEvent: Sendable, Equatable {
    /// Device events: the event's sequence number. Held events: a per-user ordinal.
    public var seq: UInt64
    /// The frame type (`FrameType.rawValue`) of the event.
    public var type: UInt8
    /// The event's body as encoded on the wire after the sequence number (`EncodedEvent.body`).
    public var body: [UInt8]
    /// For MESSAGE events: who gets MESSAGE_DELIVERED when a device acknowledges it.
    public var receipt: StoredReceipt?
    /// When the event was created, ms since the Unix epoch.
    public var createdAt: UInt64

    public init(seq: UInt64, type: UInt8, body: [UInt8], receipt: StoredReceipt? = nil, createdAt: UInt64) {
        self.seq = seq
        self.type = type
        self.body = body
        self.receipt = receipt
        self.createdAt = createdAt
    }
}

/// The sender side of a stored message, for delivery receipts.
public struct StoredReceipt: Sendable, Equatable {
    public var sender: String
    public var messageID: String
    public var recipient: String

    public init(sender: String, messageID: String, recipient: String) {
        self.sender = sender
        self.messageID = messageID
        self.recipient = recipient
    }
}

/// The kind of push token a registration holds, which decides where its wake-ups go: to
/// Apple (a PushKit VoIP token, or an alert token), to Firebase, or to the generic webhook
/// gateway. A device holds at most one registration of each kind.
public enum PushTokenKind: String, Sendable, CaseIterable, Comparable {
    /// A PushKit token: calls only (`apns-push-type: voip`).
    case apnsVoIP = "apns-voip"
    /// A regular APNs device token: alert pushes.
    case apns
    /// An FCM registration token.
    case fcm
    /// Any other platform name: the token goes, with that name, to the webhook gateway.
    case webhook

    /// The kind a PUSH_REGISTER `platform` names; any name but the three reserved ones is
    /// a webhook gateway's (as every name was before the server spoke to APNs and FCM).
    public init(platform: String) {
        self = PushTokenKind(rawValue: platform).flatMap { $0 == .webhook ? nil : $0 } ?? .webhook
    }

    public static func < (a: PushTokenKind, b: PushTokenKind) -> Bool {
        allCases.firstIndex(of: a)! < allCases.firstIndex(of: b)!
    }
}

/// A push token registered by a device (PUSH_REGISTER).
public struct PushRegistration: Sendable, Equatable {
    /// The platform name as the device gave it (`apns-voip`, `apns`, `fcm`, or a name a
    /// webhook gateway understands).
    public var platform: String
    public var token: [UInt8]
    /// APNs only: `sandbox`, or `production` (also meant by ""). Kept as given.
    public var environment: String
    /// APNs only: the app's bundle id ("": the server's configured topic).
    public var topic: String

    public init(platform: String, token: [UInt8], environment: String = "", topic: String = "") {
        self.platform = platform
        self.token = token
        self.environment = environment
        self.topic = topic
    }

    /// Derived from `platform`, so the two never disagree.
    public var kind: PushTokenKind { PushTokenKind(platform: platform) }
}

extension [PushRegistration] {
    /// Replaces the registration of `registration`'s kind (or adds it), keeping the array
    /// in kind order: one per kind, at most four, so a linear scan is the cheapest lookup.
    public mutating func register(_ registration: PushRegistration) {
        let kind = registration.kind
        removeAll { $0.kind == kind }
        let index = firstIndex { $0.kind > kind } ?? endIndex
        insert(registration, at: index)
    }

    /// Removes the registration of `kind`; true if there was one.
    @discardableResult
    public mutating func unregister(_ kind: PushTokenKind) -> Bool {
        let before = count
        removeAll { $0.kind == kind }
        return count != before
    }
}

/// A device as stored: its session, its sequence counters and its unacknowledged events.
public struct StoredDevice: Sendable, Equatable {
    public var userID: String
    public var deviceID: String
    public var sessionID: SessionID
    /// The highest sequence number ever assigned to this device (≥ the last event's). A
    /// restarted server continues after it.
    public var lastSeq: UInt64
    /// When the device was last connected or disconnected, ms since the Unix epoch.
    public var lastSeen: UInt64
    /// Unacknowledged events, ascending by `seq`, all ≤ `lastSeq`.
    public var events: [StoredEvent]
    /// At most one per `PushTokenKind`, in kind order.
    public var pushRegistrations: [PushRegistration]

    public init(
        userID: String, deviceID: String, sessionID: SessionID, lastSeq: UInt64,
        lastSeen: UInt64, events: [StoredEvent] = [], pushRegistrations: [PushRegistration] = []
    ) {
        self.userID = userID
        self.deviceID = deviceID
        self.sessionID = sessionID
        self.lastSeq = lastSeq
        self.lastSeen = lastSeen
        self.events = events
        self.pushRegistrations = pushRegistrations
    }

    /// Every number ≤ this is acknowledged: the numbers below the first stored event, or
    /// all of them up to `lastSeq` when none is stored. Numbers without an event (reserved
    /// but never used, or whose event was acknowledged) count as acknowledged, as they do in
    /// the server's queues (PROTOCOL.md: numbers may have gaps). Derived rather than stored:
    /// storing each acknowledgement's number cost the SQLite store a write of the device's
    /// row per event, more than half of its work for 1:1 messages (issue 16).
    public var ackedSeq: UInt64 { events.first.map { $0.seq - 1 } ?? lastSeq }
}

/// A remembered message id (for de-duplicating re-sent messages).
public struct StoredMessageID: Sendable, Equatable {
    public var sender: String
    public var messageID: String
    /// The server time the message was accepted with (returned again for a duplicate).
    public var serverTime: UInt64
    /// When to forget it, ms since the Unix epoch.
    public var expiresAt: UInt64

    public init(sender: String, messageID: String, serverTime: UInt64, expiresAt: UInt64) {
        self.sender = sender
        self.messageID = messageID
        self.serverTime = serverTime
        self.expiresAt = expiresAt
    }
}

extension StoredMessageID {
    /// The id's identity, without its times.
    public var key: StoredMessageKey { StoredMessageKey(sender: sender, messageID: messageID) }

    /// Whether the id is forgotten at `wall` (ms since the Unix epoch): the load skips it,
    /// and the server sweeps it from the store.
    public func hasExpired(at wall: UInt64) -> Bool { expiresAt <= wall }
}

/// A message id's identity: its sender and the id. Ordered by sender, then id, byte-wise on
/// UTF-8 (SQLite's BINARY collation): the order of every store's snapshot (`StoredSnapshot.sort()`).
public struct StoredMessageKey: Hashable, Comparable, Sendable {
    public var sender: String
    public var messageID: String

    public init(sender: String, messageID: String) {
        self.sender = sender
        self.messageID = messageID
    }

    public static func < (a: StoredMessageKey, b: StoredMessageKey) -> Bool {
        StoredSnapshot.utf8Less((a.sender, a.messageID), (b.sender, b.messageID))
    }
}

/// Everything a store holds, loaded once when the server starts.
public struct StoredSnapshot: Sendable, Equatable {
    public var devices: [StoredDevice]
    /// Events held for users that had no device, by user, ascending by ordinal.
    public var held: [String: [StoredEvent]]
    public var messageIDs: [StoredMessageID]

    public init(devices: [StoredDevice] = [], held: [String: [StoredEvent]] = [:], messageIDs: [StoredMessageID] = []) {
        self.devices = devices
        self.held = held
        self.messageIDs = messageIDs
    }
}

extension StoredSnapshot {
    /// Every store's order: devices by (user, device), message ids by (sender, message
    /// id), byte-wise on UTF-8 (SQLite's BINARY collation), so that two stores' snapshots
    /// compare equal.
    public mutating func sort() {
        devices.sort { Self.utf8Less(($0.userID, $0.deviceID), ($1.userID, $1.deviceID)) }
        Self.sortMessageIDs(&messageIDs)
    }

    /// Message ids in the order `sort()` gives them.
    public static func sortMessageIDs(_ messageIDs: inout [StoredMessageID]) {
        messageIDs.sort { $0.key < $1.key }
    }

    /// Byte-wise on UTF-8, then the second key.
    fileprivate static func utf8Less(_ a: (String, String), _ b: (String, String)) -> Bool {
        if a.0 != b.0 { return a.0.utf8.lexicographicallyPrecedes(b.0.utf8) }
        return a.1.utf8.lexicographicallyPrecedes(b.1.utf8)
    }
}
