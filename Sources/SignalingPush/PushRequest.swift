import SignalingCrypto
import SignalingStore

/// What goes on the wire for one attempt, built when the attempt starts (so that a
/// wake-up too large for its service is dropped before it costs a request) and
/// completed with credentials by the service's client when it is sent.
enum PushRequest: Equatable {
    /// The webhook gateway's JSON body (`WakeUpJSON`).
    case webhook(body: [UInt8])
    case apns(APNsRequest)
    case fcm(FCMRequest)

    var service: PushService {
        switch self {
        case .webhook: return .webhook
        case .apns: return .apns
        case .fcm: return .fcm
        }
    }
}

/// One APNs request without its provider token.
struct APNsRequest: Equatable {
    var sandbox: Bool
    /// `/3/device/<hex token>`.
    var path: String
    var topic: String
    /// `voip`, `alert` or `background`.
    var pushType: String
    /// 10: deliver at once; 5: when the device is awake anyway (Apple requires 5 for
    /// background pushes).
    var priority: Int
    /// Seconds since the epoch after which APNs stops trying; 0: no expiry set.
    var expiration: UInt64
    /// Notifications with the same id replace each other on the device (per conversation).
    var collapseID: String?
    var payload: [UInt8]
}

/// One FCM HTTP v1 message without its access token: the JSON of `messages:send`.
struct FCMRequest: Equatable {
    var body: [UInt8]
}

/// Builds each service's request from a wake-up. Pure: the payloads name who and why
/// and how many events wait, never what an event says (docs/PUSH.md, "Payloads").
struct PushRequestBuilder {
    /// The webhook's body cap (`PushGatewayConfiguration.maxBodyBytes`).
    var webhookMaxBody: Int
    /// The bundle id for APNs registrations that name none.
    var apnsDefaultTopic: String

    /// Apple's payload limits: 4 KB, 5 KB for VoIP pushes.
    static let apnsMaxPayload = 4096
    static let apnsMaxVoIPPayload = 5120
    /// FCM refuses messages whose payload exceeds 4 KB.
    static let fcmMaxBody = 4096

    /// The request, or nil when it would exceed the service's size limit.
    /// `callRemaining` is how much longer a call's ring lasts (nil for other kinds);
    /// `wallSeconds` is now on the wall clock (for apns-expiration).
    func request(
        for wakeUp: WakeUp, registration: PushRegistration, service: PushService, id: String, attempt: Int,
        callRemaining: Duration?, wallSeconds: UInt64
    ) -> PushRequest? {
        switch service {
        case .webhook:
            let body = WakeUpJSON.body(wakeUp, registration: registration, id: id, attempt: attempt)
            return body.count <= webhookMaxBody ? .webhook(body: body) : nil
        case .apns:
            return apns(wakeUp, registration, id: id, callRemaining: callRemaining, wallSeconds: wallSeconds).map { .apns($0) }
        case .fcm:
            return fcm(wakeUp, registration, id: id, callRemaining: callRemaining).map { .fcm($0) }
        }
    }

    private func apns(_ wakeUp: WakeUp, _ registration: PushRegistration, id: String, callRemaining: Duration?, wallSeconds: UInt64) -> APNsRequest? {
        let voip = registration.kind == .apnsVoIP
        var topic = registration.topic.isEmpty ? apnsDefaultTopic : registration.topic
        if voip && !topic.hasSuffix(".voip") { topic += ".voip" }
        var payload: [UInt8] = []
        var pushType: String
        var priority: Int
        payload += #"{"#.utf8
        if voip {
            // PushKit hands the whole payload to the app, which must report a call to
            // CallKit at once: no aps dictionary is needed.
            pushType = "voip"
            priority = 10
        } else {
            switch wakeUp.kind {
            case .call, .message, .missedCall:
                pushType = "alert"
                priority = 10
                // No text of ours: the app's notification service extension (woken by
                // mutable-content) connects, fetches the events and writes the alert;
                // the loc-key is what the system shows if it cannot.
                payload += #""aps":{"alert":{"loc-key":"#.utf8
                WakeUpJSON.appendString(Self.alertKey(wakeUp.kind), to: &payload)
                payload += #"},"mutable-content":1"#.utf8
                if let thread = collapseID(wakeUp) {
                    payload += #","thread-id":"#.utf8
                    WakeUpJSON.appendString(thread, to: &payload)
                }
                payload += #"},"#.utf8
            case .receipt, .other:
                // Nothing to show: a background push lets the app fetch when iOS allows.
                pushType = "background"
                priority = 5
                payload += #""aps":{"content-available":1},"#.utf8
            }
        }
        payload += #""vs":"#.utf8
        appendWakeUpFields(wakeUp, id: id, to: &payload)
        payload += #"}"#.utf8
        guard payload.count <= (voip ? Self.apnsMaxVoIPPayload : Self.apnsMaxPayload) else { return nil }
        var expiration: UInt64 = 0
        if let callRemaining {
            // Whole seconds, rounded down: APNs gives up no later than the ring does.
            expiration = wallSeconds + UInt64(max(1, callRemaining.components.seconds))
        }
        var path = "/3/device/"
        path.reserveCapacity(path.utf8.count + registration.token.count * 2)
        for byte in registration.token { path += Self.hex(byte) }
        return APNsRequest(
            sandbox: registration.environment == "sandbox", path: path, topic: topic, pushType: pushType, priority: priority,
            expiration: expiration, collapseID: wakeUp.kind == .call ? nil : collapseID(wakeUp), payload: payload)
    }

    private func fcm(_ wakeUp: WakeUp, _ registration: PushRegistration, id: String, callRemaining: Duration?) -> FCMRequest? {
        var body: [UInt8] = []
        body += #"{"message":{"token":"#.utf8
        WakeUpJSON.appendString(String(decoding: registration.token, as: UTF8.self), to: &body)
        // A call must get through Doze at once: high priority, and gone when the ring is.
        // Everything else waits for the device's next maintenance window (normal).
        let high = wakeUp.kind == .call
        body += #","android":{"priority":"#.utf8
        body += (high ? #""high""# : #""normal""#).utf8
        if let callRemaining {
            body += #","ttl":""#.utf8
            body += String(max(0, callRemaining.components.seconds)).utf8
            body += #"s""#.utf8
        }
        if wakeUp.kind != .call, let collapse = collapseID(wakeUp) {
            body += #","collapse_key":"#.utf8
            WakeUpJSON.appendString(collapse, to: &body)
        }
        body += #"},"data":"#.utf8
        // FCM data values are strings.
        appendWakeUpFields(wakeUp, id: id, pendingAsString: true, to: &body)
        body += #"}}"#.utf8
        return body.count <= Self.fcmMaxBody ? FCMRequest(body: body) : nil
    }

    /// `{"id":…,"user":…,"device":…,"kind":…,"pending":N}`: which account to connect and
    /// why (APNs under `"vs"`, FCM as `data`, where `pending` is a string: `"N"`).
    private func appendWakeUpFields(_ wakeUp: WakeUp, id: String, pendingAsString: Bool = false, to out: inout [UInt8]) {
        out += #"{"id":"#.utf8
        WakeUpJSON.appendString(id, to: &out)
        out += #","user":"#.utf8
        WakeUpJSON.appendString(wakeUp.userID, to: &out)
        out += #","device":"#.utf8
        WakeUpJSON.appendString(wakeUp.deviceID, to: &out)
        out += #","kind":"#.utf8
        WakeUpJSON.appendString(wakeUp.kind.rawValue, to: &out)
        out += (pendingAsString ? #","pending":""# : #","pending":"#).utf8
        out += String(max(0, wakeUp.pendingEvents)).utf8
        out += (pendingAsString ? #""}"# : "}").utf8
    }

    static func alertKey(_ kind: WakeUpKind) -> String {
        switch kind {
        case .call: return "VS_CALL"
        case .missedCall: return "VS_MISSED_CALL"
        default: return "VS_MESSAGE"
        }
    }

    /// The conversation's collapse id: 32 hex digits of a hash of the sender's id, so that
    /// the id is not spelled out to Apple or Google, and the same conversation gets the same
    /// id after a restart. The key is a constant (a pseudonym, not a secret: whoever knows a
    /// candidate id can compute its hash), prepared once: preparing an HMAC key costs an
    /// OpenSSL context, which per wake-up was most of the request's building.
    func collapseID(_ wakeUp: WakeUp) -> String? {
        guard let conversation = wakeUp.conversation, let key = Self.collapseKey,
            let mac = try? key.authenticate(Array(conversation.utf8))
        else { return nil }
        return mac.prefix(16).map(Self.hex).joined()
    }

    private static let collapseKey = try? HMACSHA256.Key(Array("voipserver collapse id".utf8))

    static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: [digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]], as: UTF8.self)
    }
}
