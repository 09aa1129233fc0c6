import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport

/// The interactive mode: a prompt that shows the connection state, commands typed at it,
/// and the client's events printed above it as they happen.
///
/// Threading: all state below belongs to `queue`, which is also the client's event
/// queue; keystrokes (from the input thread), probe reports (from probe threads) and
/// signals (from the watcher thread) hop onto it. The console is only written from it,
/// so output and redraws never interleave. `run` blocks the main thread until `quit`.
public final class InteractiveSession: @unchecked Sendable {
    let common: CommonOptions
    let queue = DispatchQueue(label: "voipclient.interactive")
    let clock = SystemClock()
    private let latch = OutcomeLatch()

    // MARK: State owned by `queue` (`session` is set before the queue is used)

    var session: ClientSession?
    var console: Console = PlainConsole()
    var calls = CallBook()
    var messages = MessageHistory()
    /// The probe of each call that has one, until the call ends.
    var probes: [String: CallProbe] = [:]
    /// What the peer's offer or answer announced.
    var peerMedia: [String: Result<MediaDescription, MediaDescription.ParseError>] = [:]
    var connectionState: ConnectionState = .disconnected
    var applicationState: ApplicationState = .foreground
    /// A blocking connect runs on its own thread.
    var connectInProgress = false
    /// The last reason shown for waiting to reconnect (repeats are not shown again).
    var lastReconnectReason: String?
    private var ringTimer: DispatchSourceTimer?
    var quitting = false

    /// How often an unanswered incoming call rings again (bell and a line).
    static let ringInterval: Duration = .seconds(4)
    /// The most `quit` waits for the server to confirm hang-ups and cancels.
    static let quitGrace: Duration = .seconds(2)

    public init(common: CommonOptions) {
        self.common = common
    }

    /// Runs until `quit`, Ctrl-D, the end of input or a termination signal.
    public func run() -> Outcome {
        let session: ClientSession
        do {
            session = try ClientSession(common: common, queue: queue) { [weak self] event in self?.handle(event) }
        } catch {
            StandardStreams.error("voipclient: \(error.message)\n")
            return Outcome(.usage, error.message)
        }
        self.session = session
        let onTerminal = TerminalDevice.isTerminal(0) && TerminalDevice.isTerminal(1)
        queue.sync {
            if onTerminal {
                let terminal = TerminalConsole(completions: InteractiveCommand.words)
                do {
                    try terminal.start()
                    console = terminal
                } catch {
                    StandardStreams.error("voipclient: no line editing: \(error)\n")
                }
            }
            updatePrompt()
            say("voipclient \(common.user)@\(common.device) -> \(ServerAddress.describe(common.servers)). Type 'help' for the commands.")
        }
        let input: InputReader
        do {
            input = try InputReader { [weak self] bytes in
                guard let self else { return }
                self.queue.async { self.received(bytes) }
            }
        } catch {
            queue.sync { console.stop() }
            session.close()
            StandardStreams.error("voipclient: \(error)\n")
            return Outcome(.internalError, "\(error)")
        }
        input.start()
        queue.async { self.startConnect() }

        let outcome = latch.wait()
        input.stop()
        queue.sync {
            stopRinging()
            for probe in probes.values { probe.stop() }
            probes = [:]
            console.stop()
        }
        session.close()
        if outcome.status != .ok { StandardStreams.error("voipclient: \(outcome.reason)\n") }
        return outcome
    }

    /// From the signal watcher's thread.
    public func signalReceived(_ signal: Int32) {
        queue.async { [self] in
            if signal == SIGWINCH {
                console.redraw()
            } else {
                quit(Outcome(SignalWatcher.exitStatus(for: signal), "interrupted by signal \(signal)"))
            }
        }
    }

    // MARK: Output (on `queue`)

    /// An event line: prefixed with the time of day.
    func event(_ text: String) {
        console.show("[\(Format.timeOfDay(clock.wallMilliseconds()))] \(text)")
    }

    /// A command's answer.
    func say(_ text: String) { console.show(text) }

    func updatePrompt() {
        var state = ConnectionStateText.describe(connectionState).word
        if applicationState != .foreground { state += ", \(applicationState)" }
        var prompt = "\(common.user)@\(common.device) [\(state)]"
        let ringing = calls.ringingIncoming.map(\.peer)
        if !ringing.isEmpty { prompt += " (ringing: \(ringing.joined(separator: ", ")))" }
        console.setPrompt(TerminalText.sanitized(prompt) + "> ")
    }

    // MARK: Connecting (on `queue`)

    /// The blocking connect-then-mark flow runs on a thread of its own; the state events
    /// show its progress in the prompt. After a failure the client keeps retrying by
    /// itself (unless the server said stop).
    func startConnect() {
        guard !connectInProgress, !quitting, let session else { return }
        connectInProgress = true
        let thread = Thread { [weak self] in
            // A failure shows as a state change (waiting to reconnect, or stopped).
            _ = session.connect()
            guard let self else { return }
            self.queue.async { self.connectInProgress = false }
        }
        thread.name = "voipclient-connect"
        thread.start()
    }

    // MARK: Input (on `queue`)

    private func received(_ bytes: [UInt8]) {
        guard !quitting else { return }
        for input in console.feed(bytes) {
            guard !quitting else { return }
            switch input {
            case .line(let line):
                switch InteractiveCommand.parse(line) {
                case .success(let command): execute(command)
                case .failure(let mistake): say(mistake.message)
                }
            case .endOfInput:
                quit(Outcome.ok("bye"))
            case .interrupt(let hadText):
                if !hadText { say("(Ctrl-D or 'quit' leaves)") }
            }
        }
    }

    // MARK: Ringing (on `queue`)

    func updateRinging() {
        if calls.ringingIncoming.isEmpty {
            stopRinging()
        } else if ringTimer == nil {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.schedule(deadline: .now() + Self.ringInterval.dispatchInterval, repeating: Self.ringInterval.dispatchInterval)
            timer.setEventHandler { [weak self] in self?.ringAgain() }
            timer.activate()
            ringTimer = timer
        }
        updatePrompt()
    }

    private func ringAgain() {
        let ringing = calls.ringingIncoming
        guard !ringing.isEmpty else {
            stopRinging()
            return
        }
        for call in ringing {
            event("ringing: \(call.peer) is calling (call \(Format.short(call.id))) - 'answer' or 'reject'")
        }
        console.bell()
    }

    private func stopRinging() {
        ringTimer?.cancel()
        ringTimer = nil
    }

    // MARK: Leaving (on `queue`)

    /// Hangs up active calls and cancels unanswered ones (waiting for the server's
    /// replies, and for the acceptance of messages still on their way, at most
    /// `quitGrace`), then ends `run`.
    func quit(_ outcome: Outcome) {
        guard !quitting else { return }
        quitting = true
        stopRinging()
        let group = DispatchGroup()
        if let client = session?.client, case .connected = connectionState {
            for call in calls.records {
                let done: RequestCompletion = { _ in group.leave() }
                if call.state == .active {
                    group.enter()
                    client.hangUp(callID: call.id, completion: done)
                } else if call.direction == .outgoing && (call.state == .inviting || call.state == .ringing) {
                    group.enter()
                    client.cancel(callID: call.id, completion: done)
                }
            }
        }
        let deadline = DispatchTime.now() + Self.quitGrace.dispatchInterval
        group.notify(queue: queue) { [weak self] in self?.leave(outcome, messagesDeadline: deadline) }
        queue.asyncAfter(deadline: deadline) { [weak self] in self?.leave(outcome, messagesDeadline: deadline) }
    }

    /// Ends `run` once no message the user sent still waits for the server's acceptance
    /// (while connected, until `messagesDeadline`). A message the server never accepted
    /// (typed while it was down) is lost when the process exits: that is never silent. The
    /// exit status is `unsentMessages` (8) unless a signal already chose one.
    private func leave(_ outcome: Outcome, messagesDeadline: DispatchTime) {
        guard !latch.isFinished else { return }
        let unsent = messages.records.filter { !$0.incoming && $0.state == .sending }
        if !unsent.isEmpty, case .connected = connectionState, DispatchTime.now() < messagesDeadline {
            queue.asyncAfter(deadline: min(messagesDeadline, .now() + .milliseconds(20))) { [weak self] in
                self?.leave(outcome, messagesDeadline: messagesDeadline)
            }
            return
        }
        guard !unsent.isEmpty else {
            latch.finish(outcome)
            return
        }
        let list = unsent.map { "\(Format.short($0.id)) to \($0.peer)" }.joined(separator: ", ")
        let reason = "\(Format.count(unsent.count, "message")) not accepted by the server, now dropped: \(list)"
        latch.finish(outcome.status == .ok ? Outcome(.unsentMessages, reason) : Outcome(outcome.status, "\(outcome.reason); \(reason)"))
    }
}
