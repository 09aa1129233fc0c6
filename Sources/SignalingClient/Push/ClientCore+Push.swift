import SignalingProtocol
import SignalingSupport

/// Push registrations and wake-ups (docs/CLIENT.md, "Push").
extension ClientCore {
    // MARK: Registrations

    /// On `queue`: submits a PUSH_REGISTER as a durable request, and remembers it once the
    /// server accepted it, to send it again on a fresh session.
    func registerPush(_ request: Request, completion: @escaping RequestCompletion) {
        submit(request, durable: true) { [weak self] result in
            if case .success = result, let self { self.queue.async { self.push.accepted.accepted(request) } }
            completion(result)
        }
    }

    /// On `queue`, when a connection was adopted, before the outbox is flushed.
    ///
    /// A fresh session (WELCOME not resumed) is where a server that lost the device
    /// (an in-memory server restarted, a device forgotten after `--event-ttl`, an
    /// operator's revoke) shows it: the registrations it held may be gone. Each accepted
    /// registration is sent again, unless a newer one of its kind is already queued. A
    /// resumed session keeps them, so nothing is sent; a server that kept them just
    /// replaces each with itself.
    func sessionStarted(welcome: Welcome) {
        push.welcomeLastSeq = welcome.lastSeq
        guard !welcome.resumed, !push.accepted.isEmpty else { return }
        var pending = Set<String>()
        for entry in outbox.queued {
            if case .pushRegister(let platform, _, _, _) = entry.request { pending.insert(platform) }
        }
        for request in push.accepted.toResend(except: pending) {
            logger.info("push_registration_resent", ["platform": request.pushPlatform])
            submit(request, durable: true) { [weak self] result in
                guard case .failure(.rejected) = result, let self else { return }
                self.queue.async { self.push.accepted.forget(request) }
            }
        }
    }

    // MARK: Wake-ups

    /// How a `handleWakeUp` starts, decided on `queue`.
    enum WakeUpStart {
        /// Connect with this timeout (real time), then report with `wakeUpConnected`.
        case connect(id: UInt64, timeout: Duration)
        /// Nothing to do: complete at once with this outcome.
        case finished(WakeUpOutcome)
    }

    /// On `queue`: the push woke the app. Grants the wake slice, begins the background
    /// task that holds the run's time, and says how long the connect may take.
    func beginWakeUp(_ payload: WakeUpPayload, completion: @escaping @Sendable (WakeUpOutcome) -> Void) -> WakeUpStart {
        let now = clock.now()
        let policy = configuration.backgroundExecution
        guard !isShutDown else {
            return .finished(WakeUpOutcome(payload: payload, ending: .clientShutDown, session: nil, eventsProcessed: 0, duration: .zero))
        }
        guard payload.isFor(configuration) else {
            logger.info("push_wakeup_ignored", ["user": payload.userID ?? "", "device": payload.deviceID ?? ""])
            return .finished(WakeUpOutcome(payload: payload, ending: .notForThisDevice, session: nil, eventsProcessed: 0, duration: .zero))
        }
        perform(background.wake(.pushNotification, now: now))
        push.nextWakeUpID += 1
        let id = push.nextWakeUpID
        // The task's own expiration warning ends the run too: it comes earlier than the
        // run's deadline when other tasks had already fixed the allowance.
        let task = beginBackgroundTask(name: "push-wake-up") { [weak self] in
            guard let self else { return }
            self.queue.async { self.finishWakeUp(id, .budgetExhausted) }
        }
        let budget = policy.taskAllowance - policy.expirationWarning
        push.wakeUps[id] = WakeUpRun(payload: payload, task: task, startedAt: now, deadline: now + budget, completion: completion)
        logger.info("push_wakeup", ["kind": payload.kind, "pending": payload.pending ?? -1, "id": payload.id ?? ""])
        rearmTimer()
        return .connect(id: id, timeout: min(configuration.connectTimeout, budget))
    }

    /// On `queue`: the run's blocking connect returned. On success the run waits for the
    /// pending events, with a PING whose PONG marks their end (see `WakeUpRun`).
    func wakeUpConnected(_ id: UInt64, _ result: Result<SessionInfo, ConnectError>) {
        guard push.wakeUps[id] != nil else { return }
        switch result {
        case .failure(let error):
            finishWakeUp(id, .connectFailed(error))
        case .success(let session):
            push.wakeUps[id]!.connected(session)
            // An outstanding PING (the keep-alive's) serves as well: it too was sent after
            // WELCOME on this connection.
            _ = pingNow()
            finishDrainedWakeUps()
        }
    }

    func wakeUpsSawPong() {
        guard !push.wakeUps.isEmpty else { return }
        for id in push.wakeUps.keys { push.wakeUps[id]!.pongReceived(lastDelivered: sequencer.lastDelivered) }
        finishDrainedWakeUps()
    }

    func wakeUpsSawEventProcessed() {
        guard !push.wakeUps.isEmpty else { return }
        for id in push.wakeUps.keys { push.wakeUps[id]!.eventProcessed() }
        finishDrainedWakeUps()
    }

    private func finishDrainedWakeUps() {
        let drained = push.wakeUps.filter {
            $0.value.isDrained(lastProcessed: sequencer.lastProcessed, welcomeLastSeq: push.welcomeLastSeq)
        }
        for id in drained.keys.sorted() { finishWakeUp(id, .delivered) }
    }

    func finishOverdueWakeUps(now: Instant) {
        for (id, run) in push.wakeUps.sorted(by: { $0.key < $1.key }) where now >= run.deadline {
            finishWakeUp(id, .budgetExhausted)
        }
    }

    func finishAllWakeUps(_ ending: WakeUpOutcome.Ending) {
        for id in push.wakeUps.keys.sorted() { finishWakeUp(id, ending) }
    }

    /// Ends the run's background task and reports the outcome on the event queue, after
    /// the events the run delivered. Finishing an ended run does nothing.
    func finishWakeUp(_ id: UInt64, _ ending: WakeUpOutcome.Ending) {
        guard let run = push.wakeUps.removeValue(forKey: id) else { return }
        let outcome = run.outcome(ending, now: clock.now())
        logger.info("push_wakeup_finished", ["ending": ending, "events": outcome.eventsProcessed])
        endBackgroundTask(run.task)
        let completion = run.completion
        eventQueue.async { completion(outcome) }
    }
}

extension Request {
    /// The `platform` of a PUSH_REGISTER (empty for other requests), for logs.
    var pushPlatform: String {
        if case .pushRegister(let platform, _, _, _) = self { return platform }
        return ""
    }
}
