import Synchronization

/// What the publisher thread tells the receiver thread: how many events are out, when the
/// last one left, and whether it has finished sending.
final class ProgressBoard: Sendable {
    let sent = Atomic<Int>(0)
    let lastSendNanoseconds = Atomic<UInt64>(0)
    let finished = Atomic<Bool>(false)
}

/// A value one thread produces and another reads after joining it.
final class ResultSlot<Value: Sendable>: Sendable {
    private let slot = Mutex<Value?>(nil)

    func put(_ value: Value) { slot.withLock { $0 = value } }
    func take() -> Value? { slot.withLock { $0 } }
}
