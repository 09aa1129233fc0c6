#if canImport(PushKit)
import Foundation
import PushKit

/// PushKit glue (Apple platforms only; not compiled on Linux): VoIP push tokens go to
/// `registerPush(kind: .apnsVoIP)`, an invalidated token unregisters the kind, and each
/// VoIP push goes to `handleWakeUp` after the app reported the call to CallKit: since
/// iOS 13 an app that does not report a call for every VoIP push before the delegate
/// returns is killed, and stops getting VoIP pushes.
public final class VoIPPushRegistrar: NSObject, PKPushRegistryDelegate {
    private let client: SignalingClient
    private let environment: PushEnvironment
    private let topic: String?
    private let reportCall: (WakeUpPayload) -> Void
    private let registry: PKPushRegistry

    /// - Parameters:
    ///   - environment: `.sandbox` for development builds, whose tokens are sandbox tokens.
    ///   - topic: the app's bundle id (the server adds `.voip`); nil: the server's.
    ///   - reportCall: runs on `queue` for every VoIP push, before `handleWakeUp`; it
    ///     must call `CXProvider.reportNewIncomingCall` (see `CallKitReporting`).
    public init(client: SignalingClient, environment: PushEnvironment = .production, topic: String? = nil,
                queue: DispatchQueue = .main, reportCall: @escaping (WakeUpPayload) -> Void) {
        self.client = client
        self.environment = environment
        self.topic = topic
        self.reportCall = reportCall
        registry = PKPushRegistry(queue: queue)
        super.init()
        registry.delegate = self
        registry.desiredPushTypes = [.voIP]
    }

    public func pushRegistry(_ registry: PKPushRegistry, didUpdate credentials: PKPushCredentials, for type: PKPushType) {
        guard type == .voIP else { return }
        client.registerPush(kind: .apnsVoIP, token: [UInt8](credentials.token), environment: environment, topic: topic)
    }

    public func pushRegistry(_ registry: PKPushRegistry, didInvalidatePushTokenFor type: PKPushType) {
        guard type == .voIP else { return }
        client.registerPush(kind: .apnsVoIP, token: [])
    }

    public func pushRegistry(_ registry: PKPushRegistry, didReceiveIncomingPushWith payload: PKPushPayload,
                             for type: PKPushType, completion: @escaping () -> Void) {
        guard type == .voIP else { return completion() }
        let wakeUp = WakeUpPayload(dictionary: payload.dictionaryPayload)
        reportCall(wakeUp)
        let done = PushCompletion(completion)
        client.handleWakeUp(payload: wakeUp) { _ in done.call() }
    }
}

/// PushKit's completion handler, carried to the wake-up's end. PushKit lets it be called
/// from any thread, once; the wake-up's completion runs exactly once.
private struct PushCompletion: @unchecked Sendable {
    let call: () -> Void
    init(_ call: @escaping () -> Void) { self.call = call }
}
#endif

#if canImport(CallKit)
import CallKit
import Foundation

/// CallKit glue (Apple platforms only): a VoIP push says "a call", not whose (the server
/// never puts the call's details in a push). Report it at once with a generic caller;
/// update it (`CXProvider.reportCall(with:updated:)`) when the `incomingCall` event arrives
/// over the connection, and end it (`reportCall(with:endedAt:reason:)`, `.unanswered` or
/// `.remoteEnded`) if the wake-up ends without one (the caller hung up meanwhile).
public enum CallKitReporting {
    /// Reports the pushed call to `provider`; returns the UUID CallKit knows it by.
    @discardableResult
    public static func reportPushedCall(_ payload: WakeUpPayload, to provider: CXProvider, callerName: String = "Incoming call",
                                        completion: @escaping @Sendable (Error?) -> Void = { _ in }) -> UUID {
        let uuid = UUID()
        let update = CXCallUpdate()
        update.localizedCallerName = callerName
        update.hasVideo = false
        provider.reportNewIncomingCall(with: uuid, update: update, completion: completion)
        return uuid
    }
}
#endif
