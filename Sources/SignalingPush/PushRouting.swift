import SignalingStore

/// Where a push request goes.
public enum PushService: String, Sendable, CaseIterable {
    /// Apple Push Notification service, HTTP/2 with a provider token.
    case apns
    /// Firebase Cloud Messaging, HTTP v1 with an OAuth2 access token.
    case fcm
    /// The generic JSON webhook gateway (docs/PUSH.md, "The webhook request").
    case webhook
}

/// Which of a device's registrations a wake-up uses, and which service carries it.
///
/// A call prefers a PushKit token (iOS shows the call through CallKit at once), then a
/// high-priority FCM message, then an APNs alert, then the webhook. Anything else never
/// uses a VoIP token (iOS kills an app that receives a VoIP push and reports no call):
/// an APNs alert, then FCM, then the webhook.
///
/// A kind of token whose own service is not configured falls back to the webhook gateway
/// when there is one, which receives it with its platform name as before the server spoke
/// to APNs and FCM itself.
public struct PushRouting: Sendable, Equatable {
    public var services: Set<PushService>

    public init(services: Set<PushService>) {
        self.services = services
    }

    /// The service that carries a token of `kind`, if any is configured.
    public func service(for kind: PushTokenKind) -> PushService? {
        let own: PushService
        switch kind {
        case .apnsVoIP, .apns: own = .apns
        case .fcm: own = .fcm
        case .webhook: own = .webhook
        }
        if services.contains(own) { return own }
        return services.contains(.webhook) ? .webhook : nil
    }

    static let callPreference: [PushTokenKind] = [.apnsVoIP, .fcm, .apns, .webhook]
    static let otherPreference: [PushTokenKind] = [.apns, .fcm, .webhook]

    /// The registration and service for a wake-up of `kind`, or nil when none of the
    /// device's registrations can carry it.
    public func route(_ kind: WakeUpKind, _ registrations: [PushRegistration]) -> (registration: PushRegistration, service: PushService)? {
        for preferred in kind == .call ? Self.callPreference : Self.otherPreference {
            guard let registration = registrations.first(where: { $0.kind == preferred }) else { continue }
            if let service = service(for: preferred) { return (registration, service) }
        }
        return nil
    }

    /// Whether a call can wake a device with these registrations.
    public func canWake(_ kind: WakeUpKind, _ registrations: [PushRegistration]) -> Bool {
        route(kind, registrations) != nil
    }
}
