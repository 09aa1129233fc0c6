import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport

/// `voipclient ... listen`: reports incoming calls and messages; with `--auto-answer`
/// answers (ringing first) and runs the probe until the caller hangs up, with
/// `--auto-reject` declines. `--count N` exits 0 after N calls or messages, `--count-calls N`
/// after N calls.
///
/// Threading: `run` blocks the main thread; everything else runs on `queue`, the client's
/// event queue, which owns the state below.
public final class ListenCommand: @unchecked Sendable {
    private struct Call {
        var incoming: IncomingCall
        var peerMedia: Result<MediaDescription, MediaDescription.ParseError>
        var probe: CallProbe?
        var answered = false
        var burstDone = false
        var probeResult: ProbeStatistics?
        /// Counted towards `--count` (at its end, or when we declined it).
        var handled = false
    }

    private let common: CommonOptions
    private let options: ListenOptions
    private let reporter: Reporter
    private let queue = DispatchQueue(label: "voipclient.listen")
    private let latch = OutcomeLatch()

    // MARK: State owned by `queue` (`session` is set before the queue is used)

    private var session: ClientSession?
    private var listening = false
    private var finished = false
    private var calls: [String: Call] = [:]
    private var handledCalls = 0
    private var handledMessages = 0
    private var mediaFailures: [String] = []
    private var lastStateWord = "connecting"

    public init(common: CommonOptions, options: ListenOptions) {
        self.common = common
        self.options = options
        reporter = Reporter(json: common.json)
    }

    public func run() -> Outcome {
        let session: ClientSession
        do {
            session = try ClientSession(common: common, queue: queue) { [weak self] event in self?.handle(event) }
        } catch {
            reporter.finish(Outcome(.usage, error.message))
            return Outcome(.usage, error.message)
        }
        self.session = session
        switch session.connect() {
        case .failure(let outcome):
            session.close()
            reporter.finish(outcome)
            return outcome
        case .success(let info):
            queue.async { self.start(info) }
        }
        let outcome = latch.wait()
        queue.sync { for call in calls.values { call.probe?.stop() } }
        session.close()
        reporter.finish(outcome, queue.sync { resultFields() })
        return outcome
    }

    /// SIGINT/SIGTERM/SIGHUP: hang up what is active; without `--count` that is the
    /// normal end of listening (exit 0).
    public func interrupt(_ signal: Int32) {
        queue.async { [self] in
            guard listening else {
                StandardStreams.error("voipclient: interrupted while connecting\n")
                exit(SignalWatcher.exitStatus(for: signal).rawValue)
            }
            for call in calls.values where call.answered && !call.handled {
                session?.client.hangUp(callID: call.incoming.callID)
            }
            if options.count == nil {
                finish(finalOutcome(Outcome.ok("stopped listening after \(tally)")))
            } else {
                finish(Outcome(SignalWatcher.exitStatus(for: signal), "interrupted after \(counted) of \(options.count!) \(countedWhat) (\(tally))"))
            }
        }
    }

    private var handled: Int { handledCalls + handledMessages }
    /// What `--count` / `--count-calls` compares with its limit.
    private var counted: Int { options.countCallsOnly ? handledCalls : handled }
    private var countedWhat: String { options.countCallsOnly ? "calls" : "calls or messages" }
    private var tally: String { "\(Format.count(handledCalls, "call")) and \(Format.count(handledMessages, "message"))" }

    // MARK: On `queue`

    private func start(_ info: SessionInfo) {
        reporter.emit(Reports.connected(info, common))
        reporter.emit(Reports.listening(common, answering: options.answering))
        lastStateWord = "connected"
        listening = true
        if let timeout = options.timeout {
            queue.asyncAfter(deadline: .now() + timeout.dispatchInterval) { [weak self] in self?.timeoutExpired() }
        }
        // Events that came with the WELCOME (sent while we were away) were held until now.
        for event in early { handle(event) }
        early = []
    }

    /// Events delivered before `start` ran (pending events re-sent right after WELCOME).
    private var early: [ClientEvent] = []

    private func handle(_ event: ClientEvent) {
        guard !finished else { return }
        guard listening else {
            // The connection state is known when `start` runs; the rest waits for it.
            if case .connectionStateChanged = event { return }
            early.append(event)
            return
        }
        switch event {
        case .incomingCall(let incoming):
            incomingCall(incoming)
        case .callEnded(let id, let reason, let peer, let serverTime):
            reporter.emit(Reports.callEnded(callID: id, reason: reason, peer: peer, serverTime: serverTime))
            callEnded(id)
        case .messageReceived(let message):
            reporter.emit(Reports.message(message))
            handledMessages += 1
            checkCount()
        case .deliveryReceipt(let receipt):
            reporter.emit(Reports.delivered(receipt, elapsed: nil))
        case .connectionStateChanged(let state):
            if let stop = ClientSession.stopOutcome(state) {
                finish(stop)
                return
            }
            let word = ConnectionStateText.describe(state).word
            if word != lastStateWord {
                lastStateWord = word
                reporter.emit(Reports.connection(state))
            }
        default:
            break
        }
    }

    private func incomingCall(_ incoming: IncomingCall) {
        guard calls[incoming.callID] == nil, let session else { return }
        let peerMedia = MediaDescription.parse(incoming.offer)
        calls[incoming.callID] = Call(incoming: incoming, peerMedia: peerMedia)
        reporter.emit(Reports.callIncoming(incoming, peerMedia: peerMedia))
        let id = incoming.callID
        switch options.answering {
        case .report:
            break
        case .autoReject:
            session.client.reject(callID: id, reason: .declined) { [weak self] result in
                guard let self else { return }
                switch result {
                case .success:
                    self.reporter.emit(Reports.callRejected(callID: id, reason: .declined))
                    self.markHandled(id)
                case .failure(let error):
                    self.reporter.emit(Reports.warning("could not reject call \(id): \(error)"))
                }
            }
        case .autoAnswer:
            session.client.sendRinging(callID: id)
            queue.asyncAfter(deadline: .now() + options.answerAfter.dispatchInterval) { [weak self] in self?.answer(id) }
        }
    }

    private func answer(_ id: String) {
        guard !finished, var call = calls[id], !call.handled, let session else { return }
        guard let info = currentSession() else {
            reporter.emit(Reports.warning("not connected: cannot answer call \(id)"))
            return
        }
        switch MediaSetup.makeProbe(common.media, session: info, queue: queue, report: { [weak self] in self?.probeReported(id, $0) }) {
        case .success(let probe): call.probe = probe
        case .failure(let error): reporter.emit(Reports.warning("no media probe: \(error.message)"))
        }
        calls[id] = call
        session.client.accept(callID: id, answer: MediaSetup.description(of: call.probe, common)) { [weak self] result in
            self?.acceptCompleted(id, result)
        }
    }

    private func acceptCompleted(_ id: String, _ result: Result<RequestAcceptance, RequestError>) {
        guard !finished, var call = calls[id] else { return }
        guard case .success = result else {
            if case .failure(let error) = result { reporter.emit(Reports.warning("could not answer call \(id): \(error)")) }
            call.probe?.stop()
            call.probe = nil
            calls[id] = call
            return
        }
        call.answered = true
        reporter.emit(Reports.callAccepted(callID: id, media: call.probe?.local))
        if let probe = call.probe, case .success(let description) = call.peerMedia {
            probe.beginBurst(to: description.endpoint)
        } else {
            let why: String
            if case .failure(let error) = call.peerMedia { why = "the offer has no probe address: \(error)" } else { why = "no probe socket" }
            reporter.emit(Reports.probeSkipped(callID: id, why: why))
            call.burstDone = true
        }
        calls[id] = call
    }

    private func probeReported(_ id: String, _ report: CallProbe.Report) {
        guard !finished, var call = calls[id], case .burstFinished(let statistics, let peer) = report else { return }
        call.burstDone = true
        call.probeResult = statistics
        calls[id] = call
        reporter.emit(Reports.probe(callID: id, statistics, peer: peer))
    }

    private func callEnded(_ id: String) {
        guard var call = calls[id] else { return }
        call.probe?.stop()
        call.probe = nil
        if call.answered, !call.burstDone {
            reporter.emit(Reports.warning("the call ended before the media probe was over"))
        }
        if call.answered, let maximum = common.media.maximumLossPercent {
            let statistics = call.probeResult.flatMap { $0.sent > 0 ? $0 : nil }
            if let failure = ProbeVerdict.failure(of: statistics, maximumLossPercent: maximum) {
                mediaFailures.append("call \(Format.short(id)): \(failure)")
            }
        }
        calls[id] = call
        markHandled(id)
    }

    private func markHandled(_ id: String) {
        guard var call = calls[id], !call.handled else { return }
        call.handled = true
        calls[id] = call
        handledCalls += 1
        checkCount()
    }

    private func checkCount() {
        guard let count = options.count, counted >= count else { return }
        finish(finalOutcome(Outcome.ok("handled \(tally)")))
    }

    private func timeoutExpired() {
        guard !finished else { return }
        let limit = Format.seconds(options.timeout ?? .zero)
        if let count = options.count {
            finish(Outcome(.timedOut, "only \(counted) of \(count) \(countedWhat) within --timeout \(limit)"))
        } else {
            finish(finalOutcome(Outcome.ok("listened for \(limit): \(tally)")))
        }
    }

    private func finalOutcome(_ outcome: Outcome) -> Outcome {
        guard let failure = mediaFailures.first else { return outcome }
        return Outcome(.mediaFailed, failure)
    }

    private func currentSession() -> SessionInfo? {
        if case .connected(let info) = session?.client.status.connectionState { return info }
        return nil
    }

    private func finish(_ outcome: Outcome) {
        guard !finished else { return }
        finished = true
        latch.finish(outcome)
    }

    private func resultFields() -> [JSONField] {
        [JSONField("handled", .integer(Int64(handled))), JSONField("calls", .integer(Int64(handledCalls))),
         JSONField("messages", .integer(Int64(handledMessages)))]
    }
}
