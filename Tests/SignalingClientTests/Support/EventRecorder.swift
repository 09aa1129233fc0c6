import Foundation
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

/// Collects a client's events (on its event queue) and lets a test wait, with a deadline,
/// until they satisfy a condition.
final class EventRecorder: @unchecked Sendable {
    private let condition = NSCondition()
    private var events: [ClientEvent] = []

    private var hold: ((ClientEvent) -> Bool, DispatchSemaphore)?

    func record(_ event: ClientEvent) {
        condition.lock()
        events.append(event)
        condition.broadcast()
        var gate: DispatchSemaphore?
        if let (matches, semaphore) = hold, matches(event) {
            gate = semaphore
            hold = nil
        }
        condition.unlock()
        // An app whose handler is still busy with this event (it has not "processed" it).
        gate?.wait()
    }

    /// The handler will block on the next event matching `matches` until the returned
    /// semaphore is signalled.
    func holdNext(where matches: @escaping (ClientEvent) -> Bool) -> DispatchSemaphore {
        let semaphore = DispatchSemaphore(value: 0)
        condition.lock()
        hold = (matches, semaphore)
        condition.unlock()
        return semaphore
    }

    var all: [ClientEvent] {
        condition.lock()
        defer { condition.unlock() }
        return events
    }

    /// Waits until `predicate(events)` holds; returns false at the deadline. The predicate
    /// runs without the lock held, so it may use the recorder's other accessors.
    @discardableResult
    func wait(within timeout: TimeInterval = 15, until predicate: ([ClientEvent]) -> Bool) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while true {
            condition.lock()
            let snapshot = events
            condition.unlock()
            if predicate(snapshot) { return true }
            condition.lock()
            var timedOut = false
            while events.count == snapshot.count && !timedOut {
                timedOut = !condition.wait(until: deadline)
            }
            condition.unlock()
            if timedOut { return predicate(all) }
        }
    }

    /// Waits for the first event (after `index`) matching `matches`.
    func first(within timeout: TimeInterval = 15, after index: Int = 0, _ matches: @escaping (ClientEvent) -> Bool) -> ClientEvent? {
        var found: ClientEvent?
        wait(within: timeout) { events in
            found = events.dropFirst(index).first(where: matches)
            return found != nil
        }
        return found
    }

    func count(_ matches: (ClientEvent) -> Bool) -> Int { all.filter(matches).count }

    var messages: [DeliveredMessage] {
        all.compactMap { if case .messageReceived(let message) = $0 { return message } else { return nil } }
    }
}

extension ClientEvent {
    var isConnected: Bool {
        if case .connectionStateChanged(.connected) = self { return true }
        return false
    }
    var connectedSession: SessionInfo? {
        if case .connectionStateChanged(.connected(let info)) = self { return info }
        return nil
    }
    var isWaiting: Bool {
        if case .connectionStateChanged(.waitingToReconnect) = self { return true }
        return false
    }
}

/// A client wired to a recorder and a private event queue.
struct TestClient {
    let client: SignalingClient
    let recorder: EventRecorder
    let eventQueue: DispatchQueue
    let clock: any Clock

    init(port: UInt16, host: String = "127.0.0.1", user: String = "alice", device: String = "phone",
         clock: any Clock = SystemClock(), networkMonitor: (any NetworkMonitor)? = nil,
         configure: (inout ClientConfiguration) -> Void = { _ in }) throws {
        var configuration = ClientConfiguration(host: host, port: port, userID: user, deviceID: device)
        configuration.reconnect = ReconnectPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(400))
        configuration.connectTimeout = .seconds(5)
        configure(&configuration)
        let recorder = EventRecorder()
        let queue = DispatchQueue(label: "test.events")
        self.recorder = recorder
        self.eventQueue = queue
        self.clock = clock
        client = try SignalingClient(configuration: configuration, clock: clock, logger: ProcessInfo.processInfo.environment["VSIG_TEST_LOG"] != nil ? Logger(level: .debug) : .silent, eventQueue: queue,
                                     networkMonitor: networkMonitor) { recorder.record($0) }
    }

    var core: ClientCore { client.core }

    /// Moves a manual clock and runs what became due, then lets the event queue drain.
    func advance(_ clock: ManualClock, by duration: Duration) {
        clock.advance(by: duration)
        core.queue.sync { core.processTimers() }
        eventQueue.sync {}
    }

    /// Lets everything queued on the client's queue and then its event queue run.
    func settle() {
        core.queue.sync {}
        eventQueue.sync {}
        core.queue.sync {}
        eventQueue.sync {}
    }

    var socket: SocketHandle? { core.queue.sync { core.currentConnection?.socket } }
}

/// A network monitor the test triggers by hand.
final class FakeNetworkMonitor: NetworkMonitor, @unchecked Sendable {
    private let lock = NSLock()
    private var handler: (@Sendable (NetworkChange) -> Void)?

    func start(onChange: @escaping @Sendable (NetworkChange) -> Void) throws(ConnectError) {
        lock.lock(); handler = onChange; lock.unlock()
    }
    func stop() { lock.lock(); handler = nil; lock.unlock() }
    func report(_ change: NetworkChange = NetworkChange(incomplete: true)) {
        lock.lock(); let handler = self.handler; lock.unlock()
        handler?(change)
    }
}
