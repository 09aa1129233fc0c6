import Foundation
import SignalingStore
import SignalingSupport
@testable import SignalingPush

/// An APNs-style token: 32 raw bytes, not text.
let binaryToken: [UInt8] = (0..<32).map { UInt8(($0 * 37 + 11) & 0xFF) }

func wakeUp(
    user: String = "bob", device: String = "phone", kind: WakeUpKind = .message, pending: Int = 1,
    platform: String = "apns", token: [UInt8] = binaryToken
) -> WakeUp {
    WakeUp(userID: user, deviceID: device, registration: PushRegistration(platform: platform, token: token), kind: kind, pendingEvents: pending)
}

/// Parses a wake-up body as JSON; nil when it is not a JSON object.
func jsonObject(_ bytes: [UInt8]) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any]
}

/// The documented fields of a wake-up body (docs/PUSH.md), and nothing else.
let documentedWakeUpFields: Set<String> = ["id", "user", "device", "kind", "pending", "platform", "token", "tokenEncoding", "attempt"]

extension WakeUpScheduler.Attempt {
    /// The webhook body of an attempt routed to the webhook gateway (empty otherwise).
    var webhookBody: [UInt8] {
        if case .webhook(let body) = request { return body }
        return []
    }
}
