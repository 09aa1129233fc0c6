import Foundation
import SignalingProtocol

/// Push tokens and push wake-ups (docs/CLIENT.md, "Push").
extension SignalingClient {
    /// PUSH_REGISTER: registers this device's token of one kind (a device holds one per
    /// kind; this replaces only `kind`'s). An empty token unregisters the kind.
    /// `environment` and `topic` (the app's bundle id) are for APNs kinds only; nil
    /// leaves them to the server (production, its configured topic).
    ///
    /// Kept and retried like a message until the server answers. Once accepted, the
    /// registration is remembered and sent again after a fresh session (a server that
    /// lost the device lost its tokens too); call this again whenever the platform hands
    /// out a new token.
    public func registerPush(kind: PushTokenKind, token: [UInt8], environment: PushEnvironment? = nil, topic: String? = nil,
                             completion: @escaping RequestCompletion = { _ in }) {
        if let problem = kind.registrationProblem(environment: environment, topic: topic) {
            core.eventQueue.async { completion(.failure(.invalidArgument(problem))) }
            return
        }
        let request = Request.pushRegister(platform: kind.platform, token: token, environment: environment?.rawValue, topic: topic)
        core.queue.async { [core] in core.registerPush(request, completion: completion) }
    }

    /// PUSH_REGISTER with the platform name as it goes on the wire (`apns-voip`, `apns`,
    /// `fcm`, or a webhook platform): the kind it names (`PushTokenKind(platform:)`),
    /// without environment or topic.
    public func registerPush(platform: String, token: [UInt8], completion: @escaping RequestCompletion = { _ in }) {
        registerPush(kind: PushTokenKind(platform: platform), token: token, completion: completion)
    }

    /// Handles a push wake-up, the seed's "connect, then mark the socket" flow triggered by
    /// the push instead of a lifecycle callback:
    ///
    /// 1. the push wakes the app (`woken(.pushNotification)`) and a background task
    ///    ("push-wake-up") holds its time;
    /// 2. the connect-then-mark flow runs (resuming the session), on a thread of its own,
    ///    within `connectTimeout` and the task's budget;
    /// 3. the events pending on the server arrive through the event handler (and the
    ///    streams) as usual, with their ACKs;
    /// 4. once the app has processed them, or when the budget is spent (the task's
    ///    allowance less its expiration warning), the task ends and `completion` runs on
    ///    the event queue, after the handlers of those events.
    ///
    /// The connection stays up afterwards, as after any connect. Returns at once: call it
    /// from PushKit's or FCM's callback (on iOS, report a `call` to CallKit there first:
    /// see docs/CLIENT.md). A payload for another user or device does nothing
    /// (`.notForThisDevice`).
    public func handleWakeUp(payload: WakeUpPayload, completion: @escaping @Sendable (WakeUpOutcome) -> Void = { _ in }) {
        let start = core.queue.sync { core.beginWakeUp(payload, completion: completion) }
        switch start {
        case .finished(let outcome):
            core.eventQueue.async { completion(outcome) }
        case .connect(let id, let timeout):
            // The blocking flow needs a thread that may block: never the caller's (PushKit
            // calls on the main queue) nor the client's queue.
            Thread.detachNewThread { [self] in
                let result = connectResult(timeout: timeout)
                core.queue.async { [core] in core.wakeUpConnected(id, result) }
            }
        }
    }

    /// `handleWakeUp(payload:completion:)` with the platform's dictionary
    /// (`PKPushPayload.dictionaryPayload`, a notification's `userInfo`, FCM's `data`).
    public func handleWakeUp(dictionary: [AnyHashable: Any], completion: @escaping @Sendable (WakeUpOutcome) -> Void = { _ in }) {
        handleWakeUp(payload: WakeUpPayload(dictionary: dictionary), completion: completion)
    }
}
