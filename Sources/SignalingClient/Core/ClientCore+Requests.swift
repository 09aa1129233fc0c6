import SignalingProtocol
import SignalingSupport

/// Requests from the app.
extension ClientCore {
    /// On `queue`. Durable requests are queued and survive disconnections; call requests
    /// need a live connection.
    func submit(_ request: Request, durable: Bool, completion: @escaping RequestCompletion) {
        guard !isShutDown else {
            eventQueue.async { completion(.failure(.clientShutDown(unsent: request))) }
            return
        }
        if let problem = Self.validate(request, maxFrameLength: serverMaxFrame) {
            eventQueue.async { completion(.failure(.invalidArgument(problem))) }
            return
        }
        let entry = outbox.makeEntry(request, durable: durable, completion: completion)
        if durable {
            outbox.enqueue(entry)
            flushOutbox()
            return
        }
        guard let connection = currentConnection else {
            eventQueue.async { completion(.failure(.notConnected)) }
            return
        }
        connection.send(FrameEncoder.encode(outbox.markSent(entry)))
    }

    /// Sends every queued durable request that is due, in submission order.
    func flushOutbox() {
        guard let connection = currentConnection else { return }
        let ready = outbox.takeSendable(now: clock.now())
        guard !ready.isEmpty else { return }
        var bytes: [UInt8] = []
        for entry in ready { FrameEncoder.append(outbox.markSent(entry), to: &bytes) }
        connection.send(bytes)
    }

    /// The reference codec decides what the server will accept: encode the request and
    /// decode it back with the server's frame limit. Returns the problem, or nil.
    static func validate(_ request: Request, maxFrameLength: Int) -> String? {
        let bytes = FrameEncoder.encode(.request(id: 0, request))
        if case .failure(let violation) = FrameDecoder(maxFrameLength: maxFrameLength).decode(array: bytes) {
            return violation.message
        }
        return nil
    }
}
