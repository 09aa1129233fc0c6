import SignalingStore

/// Why a device is being woken. Only the kind travels to the gateway, never the event
/// itself: the device fetches its events over its own connection once it is awake.
///
/// Kinds are ranked: when several events for one device are coalesced into one wake-up,
/// the wake-up carries the highest-ranked kind (a call outranks a message), because the
/// gateway may send a different push for it (on iOS a call needs a VoIP push).
public enum WakeUpKind: String, Sendable, CaseIterable, Comparable {
    /// Anything not listed below (lowest rank).
    case other
    /// A delivery receipt for a message the device sent.
    case receipt
    /// A new message.
    case message
    /// A call the device missed (it ended before the device came back).
    case missedCall
    /// An incoming call that is ringing now (highest rank).
    case call

    /// Higher outranks lower.
    public var rank: Int {
        switch self {
        case .other: return 0
        case .receipt: return 1
        case .message: return 2
        case .missedCall: return 3
        case .call: return 4
        }
    }

    public static func < (a: WakeUpKind, b: WakeUpKind) -> Bool { a.rank < b.rank }
}

/// A request to wake one device that has no live connection. It carries who and why,
/// and a counter; never the content of a message or a call offer.
public struct WakeUp: Sendable, Equatable {
    public var userID: String
    public var deviceID: String
    /// The device's push registrations (from PUSH_REGISTER, at most one per kind). Which
    /// one a wake-up uses is decided when it is sent, by its (coalesced) kind:
    /// `PushRouting.route`.
    public var registrations: [PushRegistration]
    public var kind: WakeUpKind
    /// Events pending for the device (shown as a badge, for instance). When wake-ups are
    /// coalesced, the latest counter wins: it is the most recent truth.
    public var pendingEvents: Int
    /// The conversation the latest event belongs to (a message's sender), for the
    /// services' collapse ids: only a hash of it leaves the server. Nil for calls.
    public var conversation: String?

    public init(
        userID: String, deviceID: String, registrations: [PushRegistration], kind: WakeUpKind, pendingEvents: Int,
        conversation: String? = nil
    ) {
        self.userID = userID
        self.deviceID = deviceID
        self.registrations = registrations
        self.kind = kind
        self.pendingEvents = pendingEvents
        self.conversation = conversation
    }

    /// A wake-up for a device with one registration.
    public init(userID: String, deviceID: String, registration: PushRegistration, kind: WakeUpKind, pendingEvents: Int) {
        self.init(userID: userID, deviceID: deviceID, registrations: [registration], kind: kind, pendingEvents: pendingEvents)
    }

    /// Folds a later wake-up for the same device into this one: the higher-ranked kind,
    /// and the later counter, conversation and registrations (the device may have
    /// registered a new token).
    mutating func absorb(_ later: WakeUp) {
        kind = max(kind, later.kind)
        pendingEvents = later.pendingEvents
        registrations = later.registrations
        if later.conversation != nil { conversation = later.conversation }
    }

    var device: DeviceKey { DeviceKey(userID: userID, deviceID: deviceID) }
}

/// What the server holds to send wake-ups: a `PushGateway`, or nothing at all when no
/// gateway is configured (the server then only logs the wake-up at debug level).
public protocol WakeUpSubmitter: Sendable {
    /// Hands a wake-up over without blocking. Returns false when it was refused at once
    /// (queue full, gateway stopped); it is counted either way.
    @discardableResult
    func submit(_ wakeUp: WakeUp) -> Bool
}
