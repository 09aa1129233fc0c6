import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// `voipclient ... send RECIPIENT TEXT`: exit 0 once the server accepted the message
/// (its OK is a promise that survives a server crash), or, with `--wait-delivered`, once a
/// recipient device acknowledged it.
///
/// Threading: `run` blocks the main thread; everything else runs on `queue`, the client's
/// event queue, which owns the state below.
public final class SendCommand: @unchecked Sendable {
    private let common: CommonOptions
    private let options: SendOptions
    private let reporter: Reporter
    private let queue = DispatchQueue(label: "voipclient.send")
    private let latch = OutcomeLatch()
    private let clock = SystemClock()

    // MARK: State owned by `queue`

    private var session: ClientSession?
    private var connecting = true
    private var messageID: String?
    private var sentAt: Instant?
    private var accepted = false
    private var finished = false

    /// The most read from standard input for `send RECIPIENT -` (the server's frame limit
    /// is far lower; the client library refuses what does not fit).
    static let standardInputLimit = 16 << 20

    public init(common: CommonOptions, options: SendOptions) {
        self.common = common
        self.options = options
        reporter = Reporter(json: common.json)
    }

    public func run() -> Outcome {
        let body: [UInt8]
        switch options.body {
        case .text(let text): body = Array(text.utf8)
        case .standardInput:
            guard let bytes = Self.readStandardInput() else {
                return finishEarly(Outcome(.usage, "standard input is over \(Self.standardInputLimit) bytes or unreadable"))
            }
            body = bytes
        }
        let session: ClientSession
        do {
            session = try ClientSession(common: common, queue: queue) { [weak self] event in self?.handle(event) }
        } catch {
            return finishEarly(Outcome(.usage, error.message))
        }
        self.session = session
        switch session.connect() {
        case .failure(let outcome):
            session.close()
            return finishEarly(outcome)
        case .success(let info):
            queue.async { self.start(info, body: body) }
        }
        let outcome = latch.wait()
        session.close()
        reporter.finish(outcome, queue.sync { [JSONField("message_id", .optional(messageID)), JSONField("recipient", .string(options.recipient))] })
        return outcome
    }

    /// SIGINT/SIGTERM/SIGHUP: nothing to undo (a message the server accepted stays accepted).
    public func interrupt(_ signal: Int32) {
        queue.async { [self] in
            let status = SignalWatcher.exitStatus(for: signal)
            if connecting {
                StandardStreams.error("voipclient: interrupted while connecting\n")
                exit(status.rawValue)
            }
            finish(Outcome(status, accepted ? "interrupted before the delivery receipt" : "interrupted before the server accepted the message"))
        }
    }

    private func finishEarly(_ outcome: Outcome) -> Outcome {
        reporter.finish(outcome)
        return outcome
    }

    static func readStandardInput() -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            guard case .transferred(let count) = SystemCall.io({ chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) } }) else {
                return nil
            }
            if count == 0 { return bytes }
            bytes.append(contentsOf: chunk[0..<count])
            if bytes.count > standardInputLimit { return nil }
        }
    }

    // MARK: On `queue`

    private func start(_ info: SessionInfo, body: [UInt8]) {
        guard let session else { return }
        connecting = false
        reporter.emit(Reports.connected(info, common))
        sentAt = clock.now()
        messageID = session.client.send(to: options.recipient, contentType: options.contentType, body: body,
                                        messageID: options.messageID) { [weak self] result in self?.sendCompleted(result) }
        queue.asyncAfter(deadline: .now() + options.timeout.dispatchInterval) { [weak self] in self?.timeoutExpired() }
    }

    private func sendCompleted(_ result: Result<RequestAcceptance, RequestError>) {
        guard !finished, let messageID, let sentAt else { return }
        switch result {
        case .success(let acceptance):
            accepted = true
            reporter.emit(Reports.messageAccepted(messageID: messageID, recipient: options.recipient,
                                                  serverTime: acceptance.serverTime, elapsed: clock.now() - sentAt))
            if !options.waitDelivered { finish(Outcome.ok("message accepted by the server")) }
        case .failure(let error):
            finish(ClientSession.outcome(for: error, doing: "accept the message"))
        }
    }

    private func handle(_ event: ClientEvent) {
        guard !finished, !connecting else { return }
        switch event {
        case .deliveryReceipt(let receipt) where receipt.messageID == messageID:
            reporter.emit(Reports.delivered(receipt, elapsed: sentAt.map { clock.now() - $0 }))
            if options.waitDelivered {
                finish(Outcome.ok("message delivered to \(receipt.recipient)@\(receipt.recipientDevice)"))
            }
        case .connectionStateChanged(let state):
            if let stop = ClientSession.stopOutcome(state) { finish(stop) }
        default:
            break
        }
    }

    private func timeoutExpired() {
        let limit = Format.seconds(options.timeout)
        if !accepted {
            finish(Outcome(.timedOut, "the server did not accept the message within --timeout \(limit)"))
        } else {
            finish(Outcome(.timedOut, "no delivery receipt from \(options.recipient) within --timeout \(limit)"))
        }
    }

    private func finish(_ outcome: Outcome) {
        guard !finished else { return }
        finished = true
        latch.finish(outcome)
    }
}
