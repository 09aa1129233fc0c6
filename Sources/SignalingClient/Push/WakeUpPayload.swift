import Foundation

/// Why the server woke the device, as its push payload says (docs/PUSH.md).
public enum WakeUpKind: String, Sendable, CaseIterable, CustomStringConvertible {
    /// An incoming call is ringing now. On iOS a VoIP push must be reported to CallKit
    /// at once, before the call's details arrive over the connection.
    case call
    case missedCall
    case message
    /// A delivery receipt for a message this device sent.
    case receipt
    /// Anything else, including a kind this library does not know yet.
    case other

    public var description: String { rawValue }
}

/// What a push wake-up carries: who it is for and why, never the event itself (the app
/// fetches the events over its own connection). Every field is optional: the library
/// only needs to know that a push arrived.
///
/// The server's pushes name these fields under a `vs` dictionary (APNs, PushKit) or at
/// the top level (FCM data messages, where every value is a string; the webhook
/// gateway's JSON): `id`, `user`, `device`, `kind`, `pending`.
public struct WakeUpPayload: Sendable, Equatable {
    /// Identifies the wake-up (the same for every retry of it).
    public var id: String?
    public var userID: String?
    public var deviceID: String?
    public var kind: WakeUpKind
    /// Events waiting for the device when the push was sent.
    public var pending: Int?

    public init(id: String? = nil, userID: String? = nil, deviceID: String? = nil, kind: WakeUpKind = .other,
                pending: Int? = nil) {
        self.id = id
        self.userID = userID
        self.deviceID = deviceID
        self.kind = kind
        self.pending = pending
    }

    /// From the dictionary the platform hands over (`PKPushPayload.dictionaryPayload`,
    /// `userInfo` of a remote notification, FCM's `data`). Unknown keys are ignored,
    /// wrongly typed values are treated as absent.
    public init(dictionary: [AnyHashable: Any]) {
        let fields = (dictionary["vs"] as? [AnyHashable: Any]) ?? dictionary
        func string(_ key: String) -> String? { fields[key] as? String }
        id = string("id")
        userID = string("user")
        deviceID = string("device")
        kind = string("kind").flatMap(WakeUpKind.init(rawValue:)) ?? .other
        if let number = fields["pending"] as? Int {
            pending = number
        } else if let text = string("pending") {
            pending = Int(text)
        } else {
            pending = nil
        }
    }

    /// From a JSON object (an FCM data message as text, the webhook gateway's body). Not
    /// a JSON object: a payload with no fields.
    public init(json: [UInt8]) {
        let object = try? JSONSerialization.jsonObject(with: Data(json))
        self.init(dictionary: (object as? [String: Any]) ?? [:])
    }

    /// False when the payload names another user or device than `configuration`'s (an
    /// app with several accounts got the push of another one).
    func isFor(_ configuration: ClientConfiguration) -> Bool {
        (userID ?? configuration.userID) == configuration.userID && (deviceID ?? configuration.deviceID) == configuration.deviceID
    }
}

/// How a `handleWakeUp` ended.
public struct WakeUpOutcome: Sendable, Equatable {
    public enum Ending: Sendable, Equatable, CustomStringConvertible {
        /// Connected, and every event pending at the connection was processed by the app.
        case delivered
        /// The time budget ran out (the background task's expiration warning, or the
        /// wake-up's own deadline) before everything pending was processed. What was
        /// not processed stays pending on the server, and arrives on the connection if
        /// it is still up (or on the next).
        case budgetExhausted
        /// The connect-then-mark flow failed; the client keeps retrying by itself.
        case connectFailed(ConnectError)
        /// The payload names another user or device: nothing was done.
        case notForThisDevice
        /// The client was shut down meanwhile.
        case clientShutDown

        public var description: String {
            switch self {
            case .delivered: return "delivered"
            case .budgetExhausted: return "budget exhausted"
            case .connectFailed(let error): return "connect failed: \(error)"
            case .notForThisDevice: return "not for this device"
            case .clientShutDown: return "client shut down"
            }
        }
    }

    public var payload: WakeUpPayload
    public var ending: Ending
    /// The session the wake-up connected (or found connected).
    public var session: SessionInfo?
    /// New events the app processed during the wake-up (duplicates dropped by the
    /// library count too: the server released them).
    public var eventsProcessed: Int
    /// From `handleWakeUp` to the end of its background task, on the client's clock.
    public var duration: Duration
}
