import Foundation
import SignalingProtocol
import SignalingSupport

/// The async/await surface, beside the callback API and built on it: the same core, the
/// same queue, the same rules (docs/CLIENT.md, "async/await").
extension SignalingClient {
    /// A client for async code: no event handler, events on a private serial queue. Read
    /// them with `events()`.
    public convenience init(configuration: ClientConfiguration, clock: any Clock = SystemClock(), logger: Logger = .silent)
        throws(ClientConfigurationError)
    {
        try self.init(configuration: configuration, clock: clock, logger: logger,
                      eventQueue: DispatchQueue(label: "vsig.client.events"), eventHandler: { _ in })
    }

    /// Every event from now on, in the order the event handler gets them (each event is
    /// handed to the handler, then to every stream, on the event queue). Several streams
    /// may be open at once; each ends when the client is shut down, and the client stops
    /// feeding a stream whose consumer went away.
    ///
    /// Subscribe before `connect`, or events that arrive meanwhile are only in the
    /// handler. An event counts as processed, and is acknowledged, once it is in every
    /// stream's buffer: a process that dies with events still buffered does not get them
    /// again. An app that must not lose one processes it in the handler.
    public func events() -> AsyncStream<ClientEvent> {
        core.subscribers.subscribe()
    }

    /// The connect-then-mark flow of `connect(timeout:)`, awaited: the blocking part runs
    /// on a thread of its own, never on a thread of the cooperative pool. Cancelling the
    /// task does not cut the attempt short; `timeout` bounds it.
    @discardableResult
    public func connect(timeout: Duration = .seconds(10)) async throws(ConnectError) -> SessionInfo {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<SessionInfo, ConnectError>, Never>) in
            Thread.detachNewThread { [self] in continuation.resume(returning: connectResult(timeout: timeout)) }
        }
        return try result.get()
    }

    /// MESSAGE_SEND, awaited: returns once the server accepted the message (possibly
    /// after reconnections: messages are kept until then), or throws the server's
    /// non-retryable refusal, `.invalidArgument` or `.clientShutDown`. Cancelling the
    /// task does not withdraw the message.
    @discardableResult
    public func send(to recipient: String, contentType: String = "text/plain", body: [UInt8], messageID: String? = nil)
        async throws(RequestError) -> MessageAcceptance
    {
        let id = messageID ?? UUID().uuidString.lowercased()
        let acceptance = try await reply { send(to: recipient, contentType: contentType, body: body, messageID: id, completion: $0) }
        return MessageAcceptance(messageID: id, serverTime: acceptance.serverTime)
    }

    /// PUSH_REGISTER, awaited (see `registerPush(kind:token:environment:topic:completion:)`).
    @discardableResult
    public func registerPush(kind: PushTokenKind, token: [UInt8], environment: PushEnvironment? = nil, topic: String? = nil)
        async throws(RequestError) -> RequestAcceptance
    {
        try await reply { registerPush(kind: kind, token: token, environment: environment, topic: topic, completion: $0) }
    }

    /// CALL_INVITE, awaited: the call id once the server accepted the invitation.
    @discardableResult
    public func invite(callee: String, offer: [UInt8], callID: String? = nil) async throws(RequestError) -> String {
        let id = callID ?? UUID().uuidString.lowercased()
        _ = try await reply { invite(callee: callee, offer: offer, callID: id, completion: $0) }
        return id
    }

    @discardableResult
    public func sendRinging(callID: String) async throws(RequestError) -> RequestAcceptance {
        try await reply { sendRinging(callID: callID, completion: $0) }
    }

    @discardableResult
    public func accept(callID: String, answer: [UInt8]) async throws(RequestError) -> RequestAcceptance {
        try await reply { accept(callID: callID, answer: answer, completion: $0) }
    }

    @discardableResult
    public func reject(callID: String, reason: CallEndReason = .declined) async throws(RequestError) -> RequestAcceptance {
        try await reply { reject(callID: callID, reason: reason, completion: $0) }
    }

    @discardableResult
    public func cancel(callID: String) async throws(RequestError) -> RequestAcceptance {
        try await reply { cancel(callID: callID, completion: $0) }
    }

    @discardableResult
    public func hangUp(callID: String) async throws(RequestError) -> RequestAcceptance {
        try await reply { hangUp(callID: callID, completion: $0) }
    }

    /// `handleWakeUp(payload:completion:)`, awaited: returns when the run's background
    /// task has ended.
    @discardableResult
    public func handleWakeUp(payload: WakeUpPayload) async -> WakeUpOutcome {
        await withCheckedContinuation { continuation in
            handleWakeUp(payload: payload) { continuation.resume(returning: $0) }
        }
    }

    /// The blocking `connect(timeout:)` as a result, for threads that hand it on.
    func connectResult(timeout: Duration) -> Result<SessionInfo, ConnectError> {
        do throws(ConnectError) {
            return .success(try connect(timeout: timeout))
        } catch {
            return .failure(error)
        }
    }

    /// One request of the callback API, awaited: its completion resumes the task.
    private func reply(_ submit: (@escaping RequestCompletion) -> Void) async throws(RequestError) -> RequestAcceptance {
        let result = await withCheckedContinuation { continuation in submit { continuation.resume(returning: $0) } }
        return try result.get()
    }
}

/// A message the server accepted.
public struct MessageAcceptance: Sendable, Equatable {
    public var messageID: String
    /// The message's server timestamp, ms since the Unix epoch.
    public var serverTime: UInt64
}
