import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport

/// The SignalingClient of one voipclient run, built from the common options, with its
/// event queue. Every mode's state lives on `queue`, which is also where the client
/// delivers events and completions: one queue, no locks.
final class ClientSession: Sendable {
    let client: SignalingClient
    let queue: DispatchQueue
    let common: CommonOptions

    /// - Parameter handler: runs on `queue` for every client event.
    init(common: CommonOptions, queue: DispatchQueue, handler: @escaping @Sendable (ClientEvent) -> Void) throws(UsageError) {
        var configuration = ClientConfiguration(servers: common.servers, userID: common.user, deviceID: common.device,
                                                credentials: common.credentials)
        configuration.connectTimeout = common.connectTimeout
        configuration.tls = common.tls
        if common.credentialsSource != .fixed {
            let (source, user, device) = (common.credentialsSource, common.user, common.device)
            configuration.credentialsProvider = { _ in
                source.credentials(user: user, device: device, now: Int64(Date().timeIntervalSince1970))
            }
        }
        let logger = common.logLevel.map { Logger(level: $0) } ?? .silent
        do {
            client = try SignalingClient(configuration: configuration, logger: logger, eventQueue: queue, eventHandler: handler)
        } catch {
            throw UsageError("\(error)")
        }
        self.queue = queue
        self.common = common
    }

    /// The blocking connect-then-mark flow, bounded by `--connect-timeout`. Never call
    /// it on `queue`.
    func connect() -> Result<SessionInfo, Outcome> {
        do {
            return .success(try client.connect(timeout: common.connectTimeout))
        } catch {
            return .failure(Self.outcome(for: error, server: ServerAddress.describe(common.servers)))
        }
    }

    /// Lets the handlers already queued finish, then shuts the client down (which
    /// acknowledges what they processed and waits for the socket to close). Never call
    /// it on `queue`.
    func close() {
        queue.sync {}
        client.shutdown()
        queue.sync {}
    }

    /// What a failed first connection means for the exit status.
    /// - Parameter server: the servers tried, as `--server` gave them.
    static func outcome(for error: ConnectError, server: String) -> Outcome {
        switch error {
        case .timedOut:
            return Outcome(.serverUnreachable, "cannot reach \(server): no answer within the connect timeout")
        case .refused, .unreachable, .resolutionFailed, .socketError:
            return Outcome(.serverUnreachable, "cannot reach \(server): \(error)")
        case .rejected(let close) where close.action == .refreshCredentials, .credentialsUnavailable(let close):
            // The first connect: fresh credentials were already asked for (--token-file,
            // --auth-key-file) or cannot be had (--token): a credentials problem, exit 5.
            return Outcome(.refused, "the server refused the credentials: \(close.code) (\(close.code.rawValue))"
                + (close.message.isEmpty ? "" : ": \(close.message)"))
        case .rejected(let close) where close.action == .stop:
            return Outcome(.refused, "the server refused the connection: \(close.code) (\(close.code.rawValue))"
                + (close.message.isEmpty ? "" : ": \(close.message)"))
        case .rejected(let close):
            return Outcome(.serverUnreachable, "the server is not taking connections now: \(close.code) (\(close.code.rawValue))"
                + (close.message.isEmpty ? "" : ": \(close.message)"))
        case .protocolViolation, .closedDuringHandshake:
            return Outcome(.refused, "\(server) does not speak the signaling protocol: \(error)"
                + (error == .closedDuringHandshake ? " (a TLS-only port? try --tls)" : ""))
        case .certificateRejected(let reason):
            return Outcome(.refused, "\(server): the server's TLS certificate was rejected: \(reason)")
        case .pinMismatch(let presented):
            return Outcome(.refused, "\(server): " + (presented.isEmpty ? "the server presented no certificate"
                : "the server's public key matches no --pin (it presented \(presented))"))
        case .tlsHandshakeFailed(let reason):
            return Outcome(.refused, "\(server): TLS handshake failed: \(reason)")
        case .cancelled, .clientShutDown, .invalidTimeout:
            return Outcome(.internalError, "connect failed: \(error)")
        }
    }

    /// What a server's refusal of a request means for the exit status.
    static func outcome(for error: RequestError, doing what: String) -> Outcome {
        switch error {
        case .rejected(let code, let message):
            return Outcome(.refused, "the server refused to \(what): \(code) (\(code.rawValue))" + (message.isEmpty ? "" : ": \(message)"))
        case .notConnected, .connectionLost:
            return Outcome(.serverUnreachable, "could not \(what): \(error)")
        case .invalidArgument(let message):
            return Outcome(.usage, "cannot \(what): \(message)")
        case .clientShutDown:
            return Outcome(.internalError, "could not \(what): the client was shut down")
        }
    }

    /// A connection state that means the server will not let us back in.
    static func stopOutcome(_ state: ConnectionState) -> Outcome? {
        guard case .stopped(.serverRefused(let close)) = state else { return nil }
        return Outcome(.refused, "the server closed the connection for good: \(close.code) (\(close.code.rawValue))"
            + (close.message.isEmpty ? "" : ": \(close.message)"))
    }
}
