import SignalingProtocol
import SignalingSupport

/// An ERROR reply.
struct ServerRefusal: Error {
    var code: ErrorCode
    var message: String
}

/// Requests waiting to be sent or answered. Owned by the client's queue.
///
/// - Durable requests (MESSAGE_SEND, PUSH_REGISTER) are idempotent on the server, so
///   they are kept until the server answers: sent in submission order when a
///   connection is up, put back (in order) when it drops before the reply, and retried
///   after a delay when the server answers with a retryable error. Sending the same
///   message again is safe: the server de-duplicates by message id.
/// - Call requests are sent only on a live connection and fail when it drops before the
///   reply: they are not idempotent, and their outcome arrives as events anyway.
struct Outbox {
    struct Entry {
        /// Submission order, to keep durable requests in order across reconnects.
        let order: UInt64
        let request: Request
        let durable: Bool
        let completion: RequestCompletion
        /// Refusals with a retryable error so far.
        var refusals = 0
        /// Not before this (after a retryable error).
        var notBefore: Instant?
    }

    private var nextOrder: UInt64 = 0
    private var nextRequestID: UInt32 = 1
    /// Durable requests not sent on the current connection, in submission order.
    private(set) var queued: [Entry] = []
    /// Sent on the current connection, waiting for OK or ERROR.
    private var inFlight: [UInt32: Entry] = [:]

    var pendingDurableCount: Int { queued.count + inFlight.values.filter(\.durable).count }

    mutating func makeEntry(_ request: Request, durable: Bool, completion: @escaping RequestCompletion) -> Entry {
        nextOrder += 1
        return Entry(order: nextOrder, request: request, durable: durable, completion: completion)
    }

    mutating func enqueue(_ entry: Entry) { queued.append(entry) }

    /// Assigns a request id and records the entry as in flight; returns the frame.
    mutating func markSent(_ entry: Entry) -> Frame {
        let id = nextRequestID
        nextRequestID = nextRequestID == UInt32.max ? 1 : nextRequestID + 1
        inFlight[id] = entry
        return .request(id: id, entry.request)
    }

    /// Durable entries that may be sent now (removed from the queue, in order).
    mutating func takeSendable(now: Instant) -> [Entry] {
        var ready: [Entry] = []
        var waiting: [Entry] = []
        for entry in queued {
            if let notBefore = entry.notBefore, notBefore > now { waiting.append(entry) } else { ready.append(entry) }
        }
        queued = waiting
        return ready
    }

    /// The earliest retry time of a queued entry.
    var nextRetry: Instant? { queued.compactMap(\.notBefore).min() }

    enum Reply {
        case completed(RequestCompletion, Result<RequestAcceptance, RequestError>)
        /// A retryable refusal of a durable request: requeued for `notBefore`.
        case willRetry(ErrorCode)
        case unknownRequest
    }

    mutating func replied(requestID: UInt32, result: Result<RequestAcceptance, ServerRefusal>, now: Instant, retryDelay: Duration) -> Reply {
        guard var entry = inFlight.removeValue(forKey: requestID) else { return .unknownRequest }
        switch result {
        case .success(let acceptance):
            return .completed(entry.completion, .success(acceptance))
        case .failure(let refusal):
            let (code, message) = (refusal.code, refusal.message)
            if entry.durable && code.isRetryable {
                entry.refusals += 1
                let factor = Int64(1) << Int64(min(entry.refusals - 1, 4))
                entry.notBefore = now + retryDelay * factor
                insertInOrder(entry)
                return .willRetry(code)
            }
            return .completed(entry.completion, .failure(.rejected(code, message: message)))
        }
    }

    /// The connection dropped: durable in-flight requests go back to the queue (in
    /// order, ready at once); call requests fail with `connectionLost`.
    mutating func connectionLost() -> [RequestCompletion] {
        var failed: [RequestCompletion] = []
        for entry in inFlight.values.sorted(by: { $0.order < $1.order }) {
            if entry.durable { insertInOrder(entry) } else { failed.append(entry.completion) }
        }
        inFlight.removeAll()
        return failed
    }

    /// The client shut down: every request ends with the unsent request in its error.
    mutating func drainAll() -> [(RequestCompletion, Request)] {
        let all = (queued + inFlight.values).sorted { $0.order < $1.order }
        queued.removeAll()
        inFlight.removeAll()
        return all.map { ($0.completion, $0.request) }
    }

    private mutating func insertInOrder(_ entry: Entry) {
        let index = queued.firstIndex { $0.order > entry.order } ?? queued.endIndex
        queued.insert(entry, at: index)
    }
}
