import CLibeventShims
import SignalingSupport

extension GatewayLoop {
    /// Puts `attempt` on the wire on `connection` (the webhook gateway).
    func send(_ attempt: WakeUpScheduler.Attempt, on connection: GatewayConnection) {
        counters.inFlight.increment()
        var started = false
        if let endpoint = configuration.endpoint, let address {
            started = connection.start(
                attempt, endpoint: endpoint, address: address, timeout: configuration.requestTimeout, now: SystemClock().now())
        }
        if !started {
            completed(attempt, on: connection, status: 0, retryAfter: nil, error: nil)
        }
    }

    /// Puts `attempt` on the wire as an HTTP/2 stream to APNs or FCM.
    func sendStream(_ attempt: WakeUpScheduler.Attempt) {
        let service = attempt.request.service
        streams[service, default: 0] += 1
        counters.inFlight.increment()
        let done: (ServiceResult) -> Void = { [self] result in
            streams[service, default: 1] -= 1
            counters.inFlight.increment(by: -1)
            finish(attempt, result.outcome, service: service, status: result.status, reason: result.detail)
        }
        switch attempt.request {
        case .apns(let request): apns!.send(request, completion: done)
        case .fcm(let request): fcm!.send(request, completion: done)
        case .webhook: done(ServiceResult(outcome: .failed(retryAfter: nil), status: 0, detail: "not a stream"))
        }
    }

    /// Called once per attempt: from libevent's callbacks, for a request cancelled at its
    /// deadline, or when libevent refused to start it.
    func completed(_ attempt: WakeUpScheduler.Attempt, on connection: GatewayConnection, status: Int, retryAfter: String?, error: Int32?) {
        counters.inFlight.increment(by: -1)
        idleConnections.append(connection.index)
        let outcome = Self.outcome(status: status, retryAfter: retryAfter)
        finish(attempt, outcome, service: .webhook, status: status, reason: status != 0 ? "status \(status)" : Self.describe(error))
    }

    /// Hands an attempt's outcome to the scheduler, removes an invalid token, logs.
    private func finish(_ attempt: WakeUpScheduler.Attempt, _ outcome: WakeUpScheduler.Outcome, service: PushService, status: Int, reason: String) {
        guard !stopRequested.load(ordering: .relaxed) else { return }
        // The token is handed over for removal and the reason counted before the scheduler
        // counts the attempt (tokensRemoved, rejected): whoever sees those counters move,
        // an operator's scrape or a test, finds the removal already done.
        switch outcome {
        case .rejected(let reason):
            counters.countRejection("\(service.rawValue):\(reason)")
        case .tokenInvalid(let reason):
            counters.countRejection("\(service.rawValue):\(reason)")
            onTokenInvalid(attempt.wakeUp, attempt.registration, reason)
        default:
            break
        }
        scheduler.complete(attempt.device, outcome, now: clock.now())
        log(attempt, service: service, status: status, reason: reason, outcome: outcome)
        pumpSoon()
    }

    /// Cancels requests older than the request timeout. libevent's own timeout only
    /// bounds each wait for the socket, so a gateway trickling its answer a byte at a
    /// time would otherwise hold a connection for ever.
    func expireOverdueRequests(now: Instant) {
        for connection in connections where connection.isBusy && connection.deadline <= now {
            guard let attempt = connection.cancel() else { continue }
            completed(attempt, on: connection, status: 0, retryAfter: nil, error: VS_HTTP_ERROR_TIMEOUT)
        }
    }

    /// 2xx delivered; 408, 429 and 5xx (and no answer at all) retried; anything else is
    /// the gateway refusing this wake-up (a bad token, a malformed request): not retried.
    static func outcome(status: Int, retryAfter: String?) -> WakeUpScheduler.Outcome {
        switch status {
        case 200..<300:
            return .delivered
        case 0, 408, 500..<600:
            return .failed(retryAfter: status == 503 ? RetryPolicy.retryAfter(header: retryAfter) : nil)
        case 429:
            return .failed(retryAfter: RetryPolicy.retryAfter(header: retryAfter))
        default:
            return .rejected(reason: "\(status)")
        }
    }

    /// Logs a failing gateway once (and its recovery), refusals per wake-up, and each
    /// failed attempt only at debug level.
    private func log(_ attempt: WakeUpScheduler.Attempt, service: PushService, status: Int, reason: String, outcome: WakeUpScheduler.Outcome) {
        switch outcome {
        case .delivered:
            if consecutiveFailures > 0 {
                logger.info("push_gateway_recovered", ["failed_attempts": consecutiveFailures])
                consecutiveFailures = 0
            }
        case .failed:
            if consecutiveFailures == 0 {
                logger.warning("push_gateway_failing", ["service": service.rawValue, "reason": reason])
            }
            consecutiveFailures += 1
            logger.debug("push_attempt_failed", [
                "user": attempt.device.userID, "device": attempt.device.deviceID, "id": attempt.id,
                "attempt": attempt.number, "reason": reason,
            ])
        case .rejected(let why), .tokenInvalid(let why):
            // Per reason at most once a minute, with how many were not logged: a service
            // refusing everything (a revoked key) must not flood the log.
            let key = "\(service.rawValue):\(why)"
            let now = SystemClock().now()
            if let last = rejectionLog[key], now - last.at < .seconds(60) {
                rejectionLog[key]!.suppressed += 1
                return
            }
            let suppressed = rejectionLog[key]?.suppressed ?? 0
            if rejectionLog.count >= PushCounters.maxReasons { rejectionLog = [:] }
            rejectionLog[key] = (now, 0)
            var removed = false
            if case .tokenInvalid = outcome { removed = true }
            logger.info("push_rejected", [
                "service": service.rawValue, "user": attempt.device.userID, "device": attempt.device.deviceID, "id": attempt.id,
                "status": status, "reason": why, "token_removed": removed, "suppressed": suppressed,
            ])
        }
    }

    static func describe(_ error: Int32?) -> String {
        switch error {
        case VS_HTTP_ERROR_TIMEOUT: return "timeout"
        case VS_HTTP_ERROR_EOF: return "connection closed"
        case VS_HTTP_ERROR_INVALID_HEADER: return "invalid response header"
        case VS_HTTP_ERROR_BUFFER: return "connection error"
        case VS_HTTP_ERROR_DATA_TOO_LONG: return "response too long"
        default: return "connection failed"
        }
    }
}
