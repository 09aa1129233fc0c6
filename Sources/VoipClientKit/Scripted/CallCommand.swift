import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport

/// `voipclient ... call CALLEE`: one test call from invitation to hang-up, with its
/// timings and the call-path probe; the exit status says how it went.
///
/// Threading: `run` blocks the main thread; every other step runs on `queue`, which is
/// also the client's event queue, so the state below is only touched there.
public final class CallCommand: @unchecked Sendable {
    private enum Phase {
        case connecting, inviting, ringing, active
        /// A cancel or hang-up is on its way; the outcome is decided.
        case ending
        case done
    }

    private let common: CommonOptions
    private let options: CallOptions
    private let reporter: Reporter
    private let queue = DispatchQueue(label: "voipclient.call")
    private let latch = OutcomeLatch()
    private let clock = SystemClock()

    // MARK: State owned by `queue` (`session` is set before the queue is used)

    private var session: ClientSession?
    private var phase = Phase.connecting
    private var callID: String?
    private var timeline = CallTimeline()
    private var probe: CallProbe?
    /// Why there is no probe result, when there is none.
    private var probeUnavailable: String?
    private var probeResult: ProbeStatistics?
    private var burstDone = false
    private var peerBurstDone = false
    private var hangupDue = false
    private var lastStateWord = "connecting"

    public init(common: CommonOptions, options: CallOptions) {
        self.common = common
        self.options = options
        reporter = Reporter(json: common.json)
    }

    /// Runs the call; returns when it is over and everything is closed.
    public func run() -> Outcome {
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
            queue.async { self.start(info) }
        }
        let outcome = latch.wait()
        queue.sync { probe?.stop() }
        session.close()
        reporter.finish(outcome, queue.sync { resultFields() })
        return outcome
    }

    /// SIGINT/SIGTERM/SIGHUP: cancel or hang up, then exit 130/143.
    public func interrupt(_ signal: Int32) {
        queue.async { [self] in
            let status = SignalWatcher.exitStatus(for: signal)
            switch phase {
            case .connecting:
                // Nothing to tidy up yet: the blocking connect holds the main thread.
                StandardStreams.error("voipclient: interrupted while connecting\n")
                exit(status.rawValue)
            case .inviting, .ringing:
                endCall(Outcome(status, "interrupted; the call was cancelled"), why: "interrupted")
            case .active:
                endCall(Outcome(status, "interrupted; the call was hung up"), why: "interrupted")
            case .ending, .done:
                break
            }
        }
    }

    private func finishEarly(_ outcome: Outcome) -> Outcome {
        reporter.finish(outcome)
        return outcome
    }

    // MARK: On `queue`

    private func start(_ info: SessionInfo) {
        guard let session else { return }
        reporter.emit(Reports.connected(info, common))
        lastStateWord = "connected"
        phase = .inviting
        switch MediaSetup.makeProbe(common.media, session: info, queue: queue, report: { [weak self] in self?.probeReported($0) }) {
        case .success(let probe): self.probe = probe
        case .failure(let error):
            probeUnavailable = error.message
            reporter.emit(Reports.warning("no media probe: \(error.message)"))
        }
        timeline.invitedAt = clock.now()
        let callID = session.client.invite(callee: options.callee, offer: MediaSetup.description(of: probe, common)) { [weak self] result in
            self?.inviteCompleted(result)
        }
        self.callID = callID
        reporter.emit(Reports.callInvited(callID: callID, callee: options.callee, media: probe?.local))
        queue.asyncAfter(deadline: .now() + options.timeout.dispatchInterval) { [weak self] in self?.timeoutExpired() }
    }

    private func inviteCompleted(_ result: Result<RequestAcceptance, RequestError>) {
        guard case .failure(let error) = result, phase != .done else { return }
        finish(ClientSession.outcome(for: error, doing: "place the call"))
    }

    private func handle(_ event: ClientEvent) {
        guard phase != .connecting, phase != .done else { return }
        let now = clock.now()
        switch event {
        case .callRinging(let id, let device) where id == callID:
            guard timeline.ringingAt == nil else { return }
            timeline.ringingAt = now
            if phase == .inviting { phase = .ringing }
            reporter.emit(Reports.callRinging(callID: id, device: device, inviteToRinging: timeline.inviteToRinging))
        case .callAccepted(let id, let device, let answer) where id == callID:
            answered(device: device, answer: answer, at: now)
        case .callEnded(let id, let reason, let peer, let serverTime) where id == callID:
            timeline.endedAt = timeline.endedAt ?? now
            reporter.emit(Reports.callEnded(callID: id, reason: reason, peer: peer, serverTime: serverTime))
            guard phase != .ending else { return }  // our own cancel or hang-up crossed it
            finish(outcome(endedBy: reason, peer: peer))
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

    private func answered(device: String, answer: [UInt8], at now: Instant) {
        guard phase == .inviting || phase == .ringing, let callID else { return }
        timeline.answeredAt = now
        phase = .active
        let peerMedia = MediaDescription.parse(answer)
        reporter.emit(Reports.callAnswered(callID: callID, device: device, inviteToAnswer: timeline.inviteToAnswer, peerMedia: peerMedia))
        if let probe, case .success(let description) = peerMedia {
            probe.beginBurst(to: description.endpoint)
            queue.asyncAfter(deadline: .now() + MediaSetup.peerBurstAllowance(common.media).dispatchInterval) { [weak self] in
                self?.peerBurstDone = true
                self?.hangUpWhenReady()
            }
        } else {
            if probeUnavailable == nil, case .failure(let error) = peerMedia { probeUnavailable = "the answer has no probe address: \(error)" }
            reporter.emit(Reports.probeSkipped(callID: callID, why: probeUnavailable ?? "no probe socket"))
            burstDone = true
            peerBurstDone = true
        }
        queue.asyncAfter(deadline: .now() + options.hangupAfter.dispatchInterval) { [weak self] in
            self?.hangupDue = true
            self?.hangUpWhenReady()
        }
    }

    private func probeReported(_ report: CallProbe.Report) {
        guard phase != .done, let callID else { return }
        switch report {
        case .burstFinished(let statistics, let peer):
            probeResult = statistics
            burstDone = true
            reporter.emit(Reports.probe(callID: callID, statistics, peer: peer))
        case .peerFinished:
            peerBurstDone = true
        }
        hangUpWhenReady()
    }

    /// Hangs up once `--hangup-after` has passed and both probe bursts are over.
    private func hangUpWhenReady() {
        guard phase == .active, hangupDue, burstDone, peerBurstDone else { return }
        endCall(mediaChecked(Outcome.ok("call completed")), why: "")
    }

    private func timeoutExpired() {
        let limit = Format.seconds(options.timeout)
        switch phase {
        case .inviting, .ringing:
            endCall(Outcome(.timedOut, "no answer from \(options.callee) within --timeout \(limit); the call was cancelled"),
                    why: "--timeout \(limit) passed")
        case .active:
            endCall(Outcome(.timedOut, "the call was still up when --timeout \(limit) passed; it was hung up"), why: "")
        default:
            break
        }
    }

    /// Cancels (before the answer) or hangs up (after), waits for the server's reply (at
    /// most `replyGrace`), then finishes with `outcome`.
    private func endCall(_ outcome: Outcome, why: String) {
        guard let session, let callID else {
            finish(outcome)
            return
        }
        let wasActive = phase == .active
        phase = .ending
        let completion: RequestCompletion = { [weak self] result in
            guard let self, self.phase == .ending else { return }
            if wasActive {
                self.timeline.endedAt = self.clock.now()
                self.reporter.emit(Reports.callHungUp(callID: callID, answerToHangup: self.timeline.answerToHangup))
            } else {
                self.reporter.emit(Reports.callCancelled(callID: callID, why: why))
            }
            if case .failure(let error) = result, case .rejected = error {
                // Ended by the server meanwhile (CALL_ENDED crossed our request): say so.
                self.reporter.emit(Reports.warning("the server answered: \(error)"))
            }
            self.finish(wasActive && outcome.status == .ok ? self.summary(outcome) : outcome)
        }
        if wasActive {
            session.client.hangUp(callID: callID, completion: completion)
        } else {
            session.client.cancel(callID: callID, completion: completion)
        }
        queue.asyncAfter(deadline: .now() + Self.replyGrace.dispatchInterval) { [weak self] in
            guard let self, self.phase == .ending else { return }
            self.finish(Outcome(outcome.status, outcome.reason + " (the server did not confirm in time)"))
        }
    }

    /// The most the server gets to confirm a cancel or hang-up.
    private static let replyGrace: Duration = .seconds(3)

    private func outcome(endedBy reason: CallEndReason, peer: String) -> Outcome {
        switch reason {
        case .unreachable: return Outcome(.calleeUnreachable, "\(peer) is unreachable: no device online")
        case .declined: return Outcome(.rejected, "\(peer) declined the call")
        case .busy: return Outcome(.rejected, "\(peer) is busy")
        case .noAnswer: return Outcome(.timedOut, "no answer: the call to \(peer) rang out")
        case .hungUp: return summary(mediaChecked(Outcome.ok("\(peer) hung up")))
        case .peerDisconnected: return Outcome(.callDropped, "the call dropped: \(peer)'s device disconnected")
        case .cancelled, .answeredElsewhere, .declinedElsewhere:
            return Outcome(.callDropped, "the call ended unexpectedly: \(reason)")
        }
    }

    /// `--require-media` / `--max-loss` applied to a call that otherwise succeeded.
    private func mediaChecked(_ outcome: Outcome) -> Outcome {
        guard outcome.status == .ok, let maximum = common.media.maximumLossPercent else { return outcome }
        let statistics = probeResult.flatMap { $0.sent > 0 ? $0 : nil }
        if let failure = ProbeVerdict.failure(of: statistics, maximumLossPercent: maximum) { return Outcome(.mediaFailed, failure) }
        return outcome
    }

    /// Adds the timings to a successful outcome's reason.
    private func summary(_ outcome: Outcome) -> Outcome {
        guard outcome.status == .ok else { return outcome }
        var parts: [String] = []
        if let value = timeline.inviteToRinging { parts.append("invite→ringing \(Format.milliseconds(value))") }
        if let value = timeline.inviteToAnswer { parts.append("invite→answer \(Format.milliseconds(value))") }
        if let value = timeline.answerToHangup { parts.append("answer→hang-up \(Format.seconds(value))") }
        return Outcome(.ok, outcome.reason + (parts.isEmpty ? "" : "; " + parts.joined(separator: ", ")))
    }

    private func finish(_ outcome: Outcome) {
        guard phase != .done else { return }
        phase = .done
        latch.finish(outcome)
    }

    private func resultFields() -> [JSONField] {
        var probeValue = JSONValue.null
        if let probeResult {
            probeValue = .object([
                JSONField("sent", .integer(Int64(probeResult.sent))), JSONField("received", .integer(Int64(probeResult.received))),
                JSONField("loss_pct", .number(probeResult.lossPercent)),
                JSONField("rtt_avg_ms", .milliseconds(probeResult.averageRoundTrip)),
                JSONField("jitter_ms", .milliseconds(probeResult.jitter)),
            ])
        }
        return [
            JSONField("call_id", .optional(callID)), JSONField("callee", .string(options.callee)),
            JSONField("invite_to_ringing_ms", .milliseconds(timeline.inviteToRinging)),
            JSONField("invite_to_answer_ms", .milliseconds(timeline.inviteToAnswer)),
            JSONField("answer_to_hangup_ms", .milliseconds(timeline.answerToHangup)),
            JSONField("probe", probeValue),
        ]
    }
}
