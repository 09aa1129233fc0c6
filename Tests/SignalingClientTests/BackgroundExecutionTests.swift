import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

@Suite("Background tasks and application state")
struct BackgroundExecutionTests {
    private func makeClient(_ clock: ManualClock) throws -> TestClient {
        try TestClient(port: 9, clock: clock)
    }

    private func states(_ recorder: EventRecorder) -> [ApplicationState] {
        recorder.all.compactMap { if case .applicationStateChanged(let state) = $0 { return state } else { return nil } }
    }

    @Test("foreground: unlimited time; background: the slice counts down; then suspended")
    func timeRemaining() throws {
        let clock = ManualClock()
        let test = try makeClient(clock)
        defer { test.client.shutdown() }
        #expect(test.client.applicationState == .foreground)
        #expect(test.client.backgroundTimeRemaining == .greatestFiniteMagnitude)
        test.client.applicationDidEnterBackground()
        #expect(test.client.applicationState == .background)
        #expect(test.client.backgroundTimeRemaining == 10)
        test.advance(clock, by: .seconds(4))
        #expect(test.client.backgroundTimeRemaining == 6)
        test.advance(clock, by: .seconds(6))
        #expect(test.client.applicationState == .suspended)
        #expect(test.client.backgroundTimeRemaining == 0)
        #expect(test.recorder.wait { _ in self.states(test.recorder) == [.background, .suspended] })
        test.client.applicationWillEnterForeground()
        #expect(test.client.backgroundTimeRemaining == .greatestFiniteMagnitude)
    }

    @Test("several tasks at once, distinct identifiers; ending twice, or .invalid, is harmless")
    func severalTasks() throws {
        let clock = ManualClock()
        let test = try makeClient(clock)
        defer { test.client.shutdown() }
        let first = test.client.beginBackgroundTask(withName: "upload")
        let second = test.client.beginBackgroundTask(withName: "save")
        #expect(first != .invalid && second != .invalid && first != second)
        test.client.applicationDidEnterBackground()
        #expect(test.client.backgroundTimeRemaining == 30)
        test.client.endBackgroundTask(first)
        test.client.endBackgroundTask(first)
        test.client.endBackgroundTask(.invalid)
        test.client.endBackgroundTask(BackgroundTaskIdentifier(rawValue: 999))
        #expect(test.core.queue.sync { test.core.background.runningTasks } == [second])
        #expect(test.client.applicationState == .background)
        test.advance(clock, by: .seconds(12))  // past the slice; the second task holds time
        #expect(test.client.applicationState == .background)
        #expect(test.client.backgroundTimeRemaining == 18)
        test.client.endBackgroundTask(second)
        #expect(test.client.applicationState == .suspended)
    }

    @Test("the expiration handler runs shortly before the deadline, not earlier; a task never ended expires")
    func expiration() throws {
        let clock = ManualClock()
        let test = try makeClient(clock)
        defer { test.client.shutdown() }
        test.client.applicationDidEnterBackground()
        let expired = LockedBox<[String]>([])
        let upload = test.client.beginBackgroundTask(withName: "upload") { expired.mutate { $0.append("upload") } }
        let stubborn = test.client.beginBackgroundTask(withName: "stubborn") { expired.mutate { $0.append("stubborn") } }
        #expect(test.client.backgroundTimeRemaining == 30)
        test.advance(clock, by: .milliseconds(24_900))
        #expect(expired.value.isEmpty)
        test.advance(clock, by: .milliseconds(100))  // 5 s before the end
        #expect(expired.value.sorted() == ["stubborn", "upload"])
        test.client.endBackgroundTask(upload)  // what an expiration handler should do
        test.advance(clock, by: .seconds(5))
        #expect(test.recorder.wait { $0.contains(.backgroundTaskExpired(stubborn, name: "stubborn")) })
        #expect(!test.recorder.all.contains(.backgroundTaskExpired(upload, name: "upload")))
        #expect(test.client.applicationState == .suspended)
        #expect(expired.value.count == 2, "each expiration handler runs once")
    }

    @Test("returning to the foreground ends running tasks without calling their expiration handlers")
    func foregroundEndsTasks() throws {
        let clock = ManualClock()
        let test = try makeClient(clock)
        defer { test.client.shutdown() }
        test.client.applicationDidEnterBackground()
        let called = LockedBox(false)
        let task = test.client.beginBackgroundTask(withName: "t") { called.mutate { $0 = true } }
        test.client.applicationWillEnterForeground()
        #expect(test.core.queue.sync { !test.core.background.isRunning(task) })
        test.advance(clock, by: .seconds(60))
        #expect(!called.value)
        #expect(test.client.applicationState == .foreground)
        test.client.endBackgroundTask(task)  // ending after the system ended it: harmless
    }

    @Test("a suspended app cannot begin a task")
    func suspendedCannotBegin() throws {
        let clock = ManualClock()
        let test = try makeClient(clock)
        defer { test.client.shutdown() }
        test.client.applicationDidEnterBackground()
        test.advance(clock, by: .seconds(10))
        #expect(test.client.applicationState == .suspended)
        #expect(test.client.beginBackgroundTask(withName: "late") == .invalid)
    }

    @Test("data on the socket wakes a suspended app for a slice; the event arrives and is notified")
    func socketDataWakes() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock)
        defer { pair.shutdown() }
        pair.client.applicationDidEnterBackground()
        pair.test.advance(clock, by: .seconds(10))
        #expect(pair.client.applicationState == .suspended)
        try pair.peer.sendEvent(seq: 1, .callIncoming(callID: "c1", caller: "bob", callerDevice: "laptop", offer: [1, 2], serverTime: 5))
        #expect(pair.recorder.wait { $0.contains(.woken(.socketData)) })
        #expect(pair.recorder.wait { events in events.contains { if case .incomingCall = $0 { return true } else { return false } } })
        #expect(pair.client.applicationState == .background)
        #expect(pair.client.backgroundTimeRemaining == 10)
        #expect(pair.client.pendingNotifications.map(\.kind) == [.incomingCall(callID: "c1", caller: "bob")])
        // The event is acknowledged once the app processed it.
        #expect(try pair.peer.readFrame() == .ack(seq: 1))
        pair.test.advance(clock, by: .seconds(10))
        #expect(pair.client.applicationState == .suspended)
    }

    @Test("the keep-alive timer wakes a suspended app")
    func keepAliveWakes() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock)
        defer { pair.shutdown() }
        pair.client.applicationDidEnterBackground()
        pair.test.advance(clock, by: .seconds(10))
        #expect(pair.client.applicationState == .suspended)
        pair.test.advance(clock, by: .seconds(590))
        #expect(pair.recorder.wait { $0.contains(.woken(.keepAliveTimer)) })
        #expect(pair.client.applicationState == .background)
        #expect(try pair.peer.readFrame() == .ping)
    }

    @Test("a network change wakes a suspended, disconnected app and it reconnects at once")
    func networkChangeWakes() throws {
        let clock = ManualClock()
        let monitor = FakeNetworkMonitor()
        let pair = try ConnectedPair(clock: clock, monitor: monitor)
        defer { pair.shutdown() }
        pair.client.applicationDidEnterBackground()
        pair.test.advance(clock, by: .seconds(10))
        pair.peer.reset()  // the connection drops while the app is suspended
        #expect(pair.recorder.wait { $0.contains { $0.isWaiting } })
        pair.test.settle()
        // Suspended: the back-off timer does not run the app. Only a wake does.
        pair.test.advance(clock, by: .seconds(30))
        #expect(pair.core.queue.sync { if case .waiting = pair.core.lifecycle { return true } else { return false } })
        let reconnect = Thread.runAsync { try pair.server.acceptSession(sessionID: SessionID(high: 10, low: 20), resumed: true) }
        monitor.report()
        let (peer, hello) = try reconnect.value()
        defer { peer.close() }
        #expect(hello.resume != nil)
        #expect(pair.recorder.wait { $0.contains(.woken(.networkChange)) && $0.filter(\.isConnected).count == 2 })
    }

    @Test("the state machine alone: slices, allowance, warnings")
    func stateMachineUnit() {
        var model = BackgroundExecution(policy: BackgroundExecutionPolicy())
        let t0 = Instant(nanoseconds: 5_000_000_000)
        #expect(model.wake(.socketData, now: t0) == [], "a foreground app needs no wake")
        #expect(model.enterBackground(now: t0) == [.stateChanged(.background)])
        #expect(model.nextDeadline == t0 + .seconds(10))
        #expect(model.tick(now: t0 + .seconds(10)) == [.stateChanged(.suspended)])
        #expect(model.wake(.networkChange, now: t0 + .seconds(20)) == [.stateChanged(.background), .woken(.networkChange)])
        let task = model.beginTask(name: "x", now: t0 + .seconds(20))
        #expect(model.timeRemaining(now: t0 + .seconds(20)) == 30)
        #expect(model.tick(now: t0 + .seconds(45)) == [.runExpirationHandler(task)])
        #expect(model.tick(now: t0 + .seconds(46)) == [])
        #expect(model.tick(now: t0 + .seconds(50)) == [.taskExpired(task, name: "x"), .stateChanged(.suspended)])
        #expect(model.endTask(task, now: t0 + .seconds(51)) == [])
    }
}

@Suite("Local notifications")
struct LocalNotificationTests {
    private func note(_ index: Int) -> LocalNotification {
        LocalNotification(identifier: "n\(index)", title: "t", body: "b\(index)")
    }

    @Test("at most 128 pending: the 129th removes the oldest and says so")
    func cap() {
        var center = LocalNotificationCenter()
        for index in 0..<128 { #expect(center.post(note(index)) == .posted) }
        #expect(center.pending.count == 128)
        #expect(center.post(note(128)) == .postedRemovingOldest(note(0)))
        #expect(center.pending.count == 128)
        #expect(center.pending.first == note(1) && center.pending.last == note(128))
    }

    @Test("same identifier replaces in place; empty identifier is refused; removal")
    func replaceAndRemove() {
        var center = LocalNotificationCenter(capacity: 3)
        #expect(center.post(note(1)) == .posted)
        var updated = note(1)
        updated.body = "new"
        #expect(center.post(updated) == .replaced)
        #expect(center.pending == [updated])
        #expect(center.post(LocalNotification(identifier: "", title: "", body: "")) == .rejected("a notification needs an identifier"))
        let removed = center.remove(identifier: "n1")
        let removedAgain = center.remove(identifier: "n1")
        #expect(removed && !removedAgain)
    }

    @Test("incoming calls and messages are notified only when not in the foreground; a missed call replaces its ring")
    func automaticNotifications() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock)
        defer { pair.shutdown() }
        try pair.peer.sendEvent(seq: 1, .message(DeliveredMessage(messageID: "m1", sender: "bob", senderDevice: "d", recipient: "alice", contentType: "text/plain", body: [1], serverTime: 1)))
        #expect(pair.recorder.wait { !$0.isEmpty && pair.recorder.messages.count == 1 })
        pair.test.settle()
        #expect(pair.client.pendingNotifications.isEmpty, "foreground: the app shows it itself")

        pair.client.applicationDidEnterBackground()
        try pair.peer.sendEvent(seq: 2, .callIncoming(callID: "c9", caller: "carol", callerDevice: "x", offer: [], serverTime: 2))
        try pair.peer.sendEvent(seq: 3, .message(DeliveredMessage(messageID: "m2", sender: "bob", senderDevice: "d", recipient: "alice", contentType: "text/plain", body: [2], serverTime: 3)))
        try pair.peer.sendEvent(seq: 4, .callEnded(callID: "c9", reason: .noAnswer, peer: "carol", serverTime: 4))
        #expect(pair.recorder.wait { events in events.contains { if case .callEnded = $0 { return true } else { return false } } })
        pair.test.settle()
        let kinds = pair.client.pendingNotifications.map(\.kind)
        #expect(kinds == [.missedCall(callID: "c9", caller: "carol"), .message(messageID: "m2", sender: "bob")])
        #expect(pair.client.postLocalNotification(LocalNotification(identifier: "app", title: "x", body: "y")) == .posted)
        pair.client.removeAllPendingNotifications()
        #expect(pair.client.pendingNotifications.isEmpty)
    }
}
