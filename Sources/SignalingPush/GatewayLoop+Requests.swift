import CLibeventShims
import SignalingSupport

extension GatewayLoop {
    /// Puts `attempt` on the wire on `connection`.
    func send(_ attempt: WakeUpScheduler.Attempt, on connection: GatewayConnection) {
        counters.inFlight.increment()
        let started = connection.start(
            attempt, endpoint: configuration.endpoint, address: address,
            timeout: configuration.requestTimeout, now: SystemClock().now())
        if !started {
            completed(attempt, on: connection, status: 0, retryAfter: nil, error: nil)
        }
    }

    /// Called once per attempt: from libevent's callbacks, for a request cancelled at its
    /// deadline, or when libevent refused to start it.
    func completed(_ attempt: WakeUpScheduler.Attempt, on connection: GatewayConnection, status: Int, retryAfter: String?, error: Int32?) {
        counters.inFlight.increment(by: -1)
        idleConnections.append(connection.index)
        let outcome = Self.outcome(status: status, retryAfter: retryAfter)
        scheduler.complete(attempt.device, outcome, now: clock.now())
        log(attempt, status: status, error: error, outcome: outcome)
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
            return .rejected
        }
    }

    /// Logs a failing gateway once (and its recovery), refusals per wake-up, and each
    /// failed attempt only at debug level.
    private func log(_ attempt: WakeUpScheduler.Attempt, status: Int, error: Int32?, outcome: WakeUpScheduler.Outcome) {
        let reason = status != 0 ? "status \(status)" : Self.describe(error)
        switch outcome {
        case .delivered:
            if consecutiveFailures > 0 {
                logger.info("push_gateway_recovered", ["failed_attempts": consecutiveFailures])
                consecutiveFailures = 0
            }
        case .failed:
            if consecutiveFailures == 0 {
                logger.warning("push_gateway_failing", [
                    "endpoint": configuration.endpoint.description, "reason": reason,
                ])
            }
            consecutiveFailures += 1
            logger.debug("push_attempt_failed", [
                "user": attempt.device.userID, "device": attempt.device.deviceID, "id": attempt.id,
                "attempt": attempt.number, "reason": reason,
            ])
        case .rejected:
            logger.info("push_rejected", [
                "user": attempt.device.userID, "device": attempt.device.deviceID, "id": attempt.id,
                "status": status,
            ])
        }
    }

    private static func describe(_ error: Int32?) -> String {
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
