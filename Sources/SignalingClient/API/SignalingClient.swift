import Foundation
import SignalingProtocol
import SignalingSupport

/// The client library apps embed: one long-lived, VoIP-marked signaling connection with
/// the mobile background model of docs/CLIENT.md.
///
/// Every method may be called from any thread. Events, request completions, keep-alive
/// handlers and expiration handlers run on the `eventQueue` given to `init`, in order.
/// Internally all state lives on one private serial queue (see `ClientCore`); the only
/// blocking call is `connect(timeout:)`, which blocks its caller by design.
public final class SignalingClient: Sendable {
    let core: ClientCore

    /// - Parameters:
    ///   - clock: where time comes from (inject a `ManualClock` in tests).
    ///   - eventQueue: where `eventHandler`, completions and handlers run.
    public init(
        configuration: ClientConfiguration, clock: any Clock = SystemClock(), logger: Logger = .silent,
        eventQueue: DispatchQueue = .main, eventHandler: @escaping @Sendable (ClientEvent) -> Void
    ) throws(ClientConfigurationError) {
        try configuration.validate()
        let tls = try configuration.tls.map { (tls) throws(ClientConfigurationError) in try TLSClientSetup(tls) }
        core = ClientCore(
            configuration: configuration, clock: clock, logger: logger, eventQueue: eventQueue,
            eventHandler: eventHandler, networkMonitor: configuration.watchesNetwork ? makeSystemNetworkMonitor() : nil, tls: tls)
    }

    /// For tests: a client whose network monitor is supplied by the caller.
    init(configuration: ClientConfiguration, clock: any Clock, logger: Logger, eventQueue: DispatchQueue,
         networkMonitor: (any NetworkMonitor)?, eventHandler: @escaping @Sendable (ClientEvent) -> Void) throws(ClientConfigurationError) {
        try configuration.validate()
        let tls = try configuration.tls.map { (tls) throws(ClientConfigurationError) in try TLSClientSetup(tls) }
        core = ClientCore(configuration: configuration, clock: clock, logger: logger, eventQueue: eventQueue,
                          eventHandler: eventHandler, networkMonitor: networkMonitor, tls: tls)
    }

    deinit {
        let core = self.core
        core.queue.async { _ = core.shutdown() }
    }

    // MARK: Connecting

    /// The blocking connect-then-mark flow (seed digest §3), for lifecycle callbacks that
    /// must not return before the socket is connected and marked (`didFinishLaunching`,
    /// `didEnterBackground`, the keep-alive handler, the network-change handler).
    ///
    /// The TCP connect and the HELLO/WELCOME handshake run on a background thread while
    /// this thread waits on an `NSConditionLock` until `timeout`. On success this thread
    /// marks the socket (`VoIPSocketOptions`) and returns the session. On timeout it
    /// cancels the attempt (its socket is closed and its thread ends) and throws
    /// `.timedOut` promptly. Either way the client keeps wanting a connection: after a
    /// failure it retries on its own with back-off, unless the server said stop.
    ///
    /// Already connected: returns the current session at once. An attempt already
    /// running (an automatic reconnect): waits for that one instead of starting another.
    @discardableResult
    public func connect(timeout: Duration = .seconds(10)) throws(ConnectError) -> SessionInfo {
        guard timeout > .zero, timeout < .seconds(86_400 * 365) else { throw .invalidTimeout }
        let deadline = Date(timeIntervalSinceNow: timeout.seconds)
        let step = core.queue.sync { core.beginExplicitConnect(timeout: timeout) }
        switch step {
        case .alreadyConnected(let info):
            return info
        case .failed(let error):
            throw error
        case .own(let attempt):
            return try core.completeOwnedAttempt(attempt, deadline: deadline)
        case .join(let attempt):
            guard let result = attempt.waitUntilSettled(before: deadline) else { throw .timedOut }
            return try result.get()
        }
    }

    /// Closes the connection and stops reconnecting. Queued messages are kept and sent
    /// after the next `connect`.
    public func disconnect() {
        core.queue.async { [core] in core.disconnect() }
    }

    /// Disconnects for good; pending requests end with `.clientShutDown(unsent:)`.
    /// Waits until the client's state is torn down (not for the app's queue), and, for
    /// at most `Connection.closeGrace`, until the connection has written what was queued
    /// (the last ACK) and closed its socket: a process may exit right after this returns.
    public func shutdown() {
        let closing = core.queue.sync { core.shutdown() }
        closing?.waitUntilEnded(timeout: Connection.closeGrace)
    }

    public var status: ClientStatus { core.queue.sync { core.status() } }

    // MARK: Calls

    /// CALL_INVITE. Returns the call id (generated when nil). Needs a live connection.
    @discardableResult
    public func invite(callee: String, offer: [UInt8], callID: String? = nil, completion: @escaping RequestCompletion = { _ in }) -> String {
        let id = callID ?? UUID().uuidString.lowercased()
        submit(.callInvite(callID: id, callee: callee, offer: offer), durable: false, completion: completion)
        return id
    }

    /// CALL_RINGING: this device is showing the call.
    public func sendRinging(callID: String, completion: @escaping RequestCompletion = { _ in }) {
        submit(.callRinging(callID: callID), durable: false, completion: completion)
    }

    /// CALL_ACCEPT with the answer blob.
    public func accept(callID: String, answer: [UInt8], completion: @escaping RequestCompletion = { _ in }) {
        submit(.callAccept(callID: callID, answer: answer), durable: false, completion: completion)
    }

    /// CALL_REJECT; `reason` must be `.declined` or `.busy`.
    public func reject(callID: String, reason: CallEndReason = .declined, completion: @escaping RequestCompletion = { _ in }) {
        guard reason.isRejectReason else {
            core.eventQueue.async { completion(.failure(.invalidArgument("reject reason must be declined or busy, not \(reason)"))) }
            return
        }
        submit(.callReject(callID: callID, reason: reason), durable: false, completion: completion)
    }

    /// CALL_CANCEL: the caller gives up before an answer.
    public func cancel(callID: String, completion: @escaping RequestCompletion = { _ in }) {
        submit(.callCancel(callID: callID), durable: false, completion: completion)
    }

    /// CALL_HANGUP: ends an active call.
    public func hangUp(callID: String, completion: @escaping RequestCompletion = { _ in }) {
        submit(.callHangup(callID: callID), durable: false, completion: completion)
    }

    // MARK: Messages

    /// MESSAGE_SEND. Kept until the server accepts it: sent now if connected, otherwise
    /// after the next (re)connection, and again after every reconnection until the reply
    /// arrives; the server de-duplicates by message id, so it is delivered once. The
    /// completion runs once: `.success` with the server timestamp, or the server's
    /// non-retryable error, or `.clientShutDown` with the unsent message. Returns the
    /// message id (generated when nil).
    @discardableResult
    public func send(to recipient: String, contentType: String = "text/plain", body: [UInt8], messageID: String? = nil,
                     completion: @escaping RequestCompletion = { _ in }) -> String {
        let id = messageID ?? UUID().uuidString.lowercased()
        let message = OutgoingMessage(messageID: id, recipient: recipient, contentType: contentType, body: body)
        submit(.messageSend(message), durable: true, completion: completion)
        return id
    }

    private func submit(_ request: Request, durable: Bool, completion: @escaping RequestCompletion) {
        core.queue.async { [core] in core.submit(request, durable: durable, completion: completion) }
    }
}
