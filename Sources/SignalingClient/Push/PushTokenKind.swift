import SignalingProtocol

/// The kind of a push token, as PUSH_REGISTER names it in `platform` (PROTOCOL §6.3).
/// A device holds one token per kind: registering a kind replaces only that kind's token.
public enum PushTokenKind: Hashable, Sendable, CustomStringConvertible {
    /// A PushKit VoIP token (`apns-voip`): wakes the app for calls, which it must report
    /// to CallKit at once.
    case apnsVoIP
    /// An APNs alert token (`apns`): messages and missed calls.
    case apns
    /// A Firebase Cloud Messaging registration token (`fcm`).
    case fcm
    /// A token for the server's generic webhook push gateway, under a platform name of the
    /// app's choosing. The name must not be one of the kinds above (the server would read
    /// it as that kind).
    case webhook(platform: String)

    /// The reserved wire names, in the order of the cases above.
    static let reservedPlatforms: [String] = ["apns-voip", "apns", "fcm"]

    /// The kind a PUSH_REGISTER `platform` names: any name that is not reserved is a
    /// webhook platform.
    public init(platform: String) {
        switch platform {
        case "apns-voip": self = .apnsVoIP
        case "apns": self = .apns
        case "fcm": self = .fcm
        default: self = .webhook(platform: platform)
        }
    }

    /// The PUSH_REGISTER `platform` field.
    public var platform: String {
        switch self {
        case .apnsVoIP: return "apns-voip"
        case .apns: return "apns"
        case .fcm: return "fcm"
        case .webhook(let platform): return platform
        }
    }

    /// APNs tokens carry an environment and a topic; the others do not.
    public var isAPNs: Bool { self == .apnsVoIP || self == .apns }

    public var description: String { platform }

    /// Why a registration of this kind with these fields would be refused before it is
    /// sent, or nil: a webhook platform that names a kind, APNs fields on another kind.
    /// (The codec checks the lengths.)
    public func registrationProblem(environment: PushEnvironment?, topic: String?) -> String? {
        if case .webhook(let platform) = self, Self.reservedPlatforms.contains(platform) {
            return "\"\(platform)\" names a push kind, not a webhook platform"
        }
        if !isAPNs && (environment != nil || topic != nil) {
            return "environment and topic are for APNs tokens, not \(self)"
        }
        return nil
    }
}

/// The APNs endpoint a token belongs to: a development build's tokens are sandbox tokens.
public enum PushEnvironment: String, Sendable, CaseIterable, CustomStringConvertible {
    case production
    case sandbox

    public var description: String { rawValue }
}

/// What the client remembers of the registrations the server accepted, to send them
/// again on a fresh session (docs/CLIENT.md, "Push"): the latest accepted request per
/// kind. Cost: one entry per kind the app registered (a handful), a dictionary lookup
/// per accepted registration.
struct AcceptedPushRegistrations {
    /// Keyed by the PUSH_REGISTER `platform`.
    private var byPlatform: [String: Request] = [:]
    /// The order in which kinds were first accepted, so that re-sending is deterministic.
    private var order: [String] = []

    /// The server accepted `request` (a `.pushRegister`); an empty token unregistered
    /// its kind, which is then forgotten.
    mutating func accepted(_ request: Request) {
        guard case .pushRegister(let platform, let token, _, _) = request else { return }
        if token.isEmpty {
            byPlatform[platform] = nil
            order.removeAll { $0 == platform }
            return
        }
        if byPlatform.updateValue(request, forKey: platform) == nil { order.append(platform) }
    }

    /// The server refused a re-sent registration for good: stop re-sending it.
    mutating func forget(_ request: Request) {
        guard case .pushRegister(let platform, _, _, _) = request, byPlatform[platform] == request else { return }
        byPlatform[platform] = nil
        order.removeAll { $0 == platform }
    }

    /// The registrations to send again, except the kinds in `pending` (a newer request
    /// of that kind is already on its way).
    func toResend(except pending: Set<String>) -> [Request] {
        order.filter { !pending.contains($0) }.compactMap { byPlatform[$0] }
    }

    var isEmpty: Bool { byPlatform.isEmpty }
}
