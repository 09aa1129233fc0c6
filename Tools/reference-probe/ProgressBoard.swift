import CLinuxShims
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What the publisher thread tells the receiver thread (how many events are out, when the
/// last one left, whether it has finished sending), and, closed-loop, what the receiver
/// tells the publisher: how many events arrived, with an eventfd the publisher sleeps on.
final class ProgressBoard: Sendable {
    let sent = Atomic<Int>(0)
    let lastSendNanoseconds = Atomic<UInt64>(0)
    let finished = Atomic<Bool>(false)
    /// Events the receiver has read (closed-loop only; 0 otherwise).
    let received = Atomic<Int>(0)
    /// Signalled by the receiver after `received` grew (closed-loop only).
    let arrivals: Int32

    init() {
        arrivals = shim_eventfd()
    }

    deinit { close(arrivals) }

    /// The receiver read events: count them and wake the publisher.
    func arrived(_ count: Int) {
        received.add(count, ordering: .releasing)
        shim_eventfd_signal(arrivals)
    }

    /// Sleeps until `count` events have arrived or the deadline (monotonic nanoseconds)
    /// passed: true when they arrived.
    func waitForArrivals(_ count: Int, deadline: UInt64, clock: SystemClock) -> Bool {
        while received.load(ordering: .acquiring) < count {
            let now = clock.now().nanoseconds
            guard now < deadline else { return false }
            var descriptor = pollfd(fd: arrivals, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(clamping: (deadline - now) / 1_000_000 + 1)
            if poll(&descriptor, 1, milliseconds) > 0 { shim_eventfd_drain(arrivals) }
        }
        return true
    }
}

/// A value one thread produces and another reads after joining it.
final class ResultSlot<Value: Sendable>: Sendable {
    private let slot = Mutex<Value?>(nil)

    func put(_ value: Value) { slot.withLock { $0 = value } }
    func take() -> Value? { slot.withLock { $0 } }
}
