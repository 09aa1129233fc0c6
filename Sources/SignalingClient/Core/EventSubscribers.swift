import Synchronization

/// The `AsyncStream`s of `SignalingClient.events()`. Each stream gets every event the
/// event handler gets, in the same order: both are fed from the same block on the app's
/// event queue. Cost: one continuation per live stream; a yield per stream per event.
final class EventSubscribers: Sendable {
    private struct State {
        var next = 0
        var continuations: [Int: AsyncStream<ClientEvent>.Continuation] = [:]
        /// After `finishAll`, new streams are returned finished.
        var finished = false
    }

    private let state = Mutex(State())

    /// A new stream of every event from now on; unbounded, since dropping events would
    /// break the order and completeness the callback API promises.
    func subscribe() -> AsyncStream<ClientEvent> {
        let (stream, continuation) = AsyncStream<ClientEvent>.makeStream(bufferingPolicy: .unbounded)
        let key: Int? = state.withLock { state in
            guard !state.finished else { return nil }
            state.next += 1
            state.continuations[state.next] = continuation
            return state.next
        }
        guard let key else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.continuations.removeValue(forKey: key) }
        }
        return stream
    }

    /// On the event queue.
    func yield(_ event: ClientEvent) {
        let continuations = state.withLock { Array($0.continuations.values) }
        for continuation in continuations { continuation.yield(event) }
    }

    /// On the event queue, after the client's last event: every stream ends.
    func finishAll() {
        let continuations = state.withLock { state in
            state.finished = true
            defer { state.continuations.removeAll() }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
