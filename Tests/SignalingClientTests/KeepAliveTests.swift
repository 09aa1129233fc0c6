import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

@Suite("Keep-alive handler")
struct KeepAliveTests {
    @Test("setKeepAliveTimeout refuses 599 s (and NaN, infinity) and installs nothing; 600 s is accepted")
    func minimumInterval() throws {
        let clock = ManualClock()
        let test = try TestClient(port: 9, clock: clock)
        defer { test.client.shutdown() }
        let calls = LockedBox(0)
        #expect(!test.client.setKeepAliveTimeout(599) { calls.mutate { $0 += 1 } })
        #expect(!test.client.setKeepAliveTimeout(599.999) { calls.mutate { $0 += 1 } })
        #expect(!test.client.setKeepAliveTimeout(.nan) { calls.mutate { $0 += 1 } })
        #expect(!test.client.setKeepAliveTimeout(-600) { calls.mutate { $0 += 1 } })
        #expect(!test.client.setKeepAliveTimeout(.infinity) { calls.mutate { $0 += 1 } })
        #expect(test.core.queue.sync { test.core.keepAliveHandler == nil && test.core.keepAlive.nextRun == nil })
        test.advance(clock, by: .seconds(3600))
        #expect(calls.value == 0)

        #expect(test.client.setKeepAliveTimeout(600) { calls.mutate { $0 += 1 } })
        #expect(test.client.status.keepAliveInterval == .seconds(600))
        test.advance(clock, by: .seconds(600))
        #expect(calls.value == 1)
    }

    @Test("the handler fires when the interval has passed, not before, and pings the server")
    func firesOnTime() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 600)
        defer { pair.shutdown() }
        let calls = LockedBox(0)
        #expect(pair.client.setKeepAliveTimeout(600) { calls.mutate { $0 += 1 } })

        pair.test.advance(clock, by: .milliseconds(599_900))
        #expect(calls.value == 0)
        #expect(pair.core.queue.sync { pair.core.keepAlive.canPing }, "no PING before the interval")

        pair.test.advance(clock, by: .milliseconds(100))
        #expect(calls.value == 1)
        #expect(try pair.peer.readFrame() == .ping)
        clock.advance(by: .milliseconds(40))
        try pair.peer.send(.pong)
        let answered = pair.recorder.first { if case .keepAliveAnswered = $0 { return true } else { return false } }
        #expect(answered == .keepAliveAnswered(roundTrip: .milliseconds(40)))
        #expect(pair.client.status.lastPongRoundTrip == .milliseconds(40))

        // The next run is one interval after this one, again.
        pair.test.advance(clock, by: .milliseconds(599_000))
        #expect(calls.value == 1)
        pair.test.advance(clock, by: .seconds(1))
        #expect(calls.value == 2)
        #expect(try pair.peer.readFrame() == .ping)
    }

    @Test("the server's WELCOME interval wins over a shorter app interval: never ping more often")
    func serverIntervalRespected() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 900)
        defer { pair.shutdown() }
        let calls = LockedBox(0)
        #expect(pair.client.setKeepAliveTimeout(600) { calls.mutate { $0 += 1 } })
        #expect(pair.client.status.keepAliveInterval == .seconds(900))
        pair.test.advance(clock, by: .seconds(600))
        #expect(calls.value == 0)
        #expect(pair.core.queue.sync { pair.core.keepAlive.canPing })
        pair.test.advance(clock, by: .seconds(300))
        #expect(calls.value == 1)
        #expect(try pair.peer.readFrame() == .ping)
    }

    @Test("without an app handler the library still pings at the server's interval")
    func defaultHandlerPings() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 700)
        defer { pair.shutdown() }
        pair.test.advance(clock, by: .seconds(699))
        #expect(pair.core.queue.sync { pair.core.keepAlive.canPing })
        pair.test.advance(clock, by: .seconds(1))
        #expect(try pair.peer.readFrame() == .ping)
    }

    @Test("a PING without PONG within 10 s: the client drops the connection and resumes on a new one")
    func missingPongReconnects() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 600, sessionID: SessionID(high: 4, low: 2))
        defer { pair.shutdown() }
        pair.test.advance(clock, by: .seconds(600))
        #expect(try pair.peer.readFrame() == .ping)
        // No PONG. 9.9 s later nothing has happened yet...
        pair.test.advance(clock, by: .milliseconds(9_900))
        #expect(pair.core.queue.sync { pair.core.currentConnection != nil })
        // ...at 10 s the connection is declared dead and a resume attempt starts at once.
        let reconnect = Thread.runAsync { try pair.server.acceptSession(sessionID: SessionID(high: 4, low: 2), resumed: true) }
        pair.test.advance(clock, by: .milliseconds(100))
        let (newPeer, hello) = try reconnect.value()
        defer { newPeer.close() }
        #expect(hello.resume?.sessionID == SessionID(high: 4, low: 2))
        #expect(pair.recorder.wait { events in
            events.contains { if case .connectionStateChanged(.waitingToReconnect(_, .keepAliveTimedOut)) = $0 { return true } else { return false } }
            && events.filter(\.isConnected).count == 2
        })
        #expect(pair.client.status.reconnectCount == 1)
        // The old connection was closed by the client.
        _ = try pair.peer.waitForClose()
    }

    @Test("a handler still running after its 10 s budget is reported as expired")
    func handlerBudgetExpires() throws {
        let clock = ManualClock()
        let test = try TestClient(port: 9, clock: clock)
        defer { test.client.shutdown() }
        let release = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        #expect(test.client.setKeepAliveTimeout(600) {
            started.signal()
            release.wait()  // a handler that overruns its budget
        })
        clock.advance(by: .seconds(600))
        test.core.queue.sync { test.core.processTimers() }
        #expect(started.wait(timeout: .now() + 5) == .success)
        test.core.queue.sync {}
        clock.advance(by: .milliseconds(9_999))
        test.core.queue.sync { test.core.processTimers() }
        #expect(test.core.queue.sync { test.core.keepAlive.handlerDeadline != nil })
        clock.advance(by: .milliseconds(1))
        test.core.queue.sync { test.core.processTimers() }
        release.signal()
        #expect(test.recorder.wait { $0.contains(.keepAliveHandlerExpired) })
    }

    @Test("a platform keep-alive that fires early (iOS may) runs the keep-alive at once, and the next run counts from it")
    func platformKeepAliveRunsEarly() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 600)
        defer { pair.shutdown() }
        let calls = LockedBox(0)
        #expect(pair.client.setKeepAliveTimeout(600) { calls.mutate { $0 += 1 } })
        pair.test.advance(clock, by: .seconds(550))
        pair.core.queue.sync { pair.core.systemKeepAliveFired() }
        pair.test.settle()
        #expect(calls.value == 1)
        #expect(try pair.peer.readFrame() == .ping)
        pair.test.advance(clock, by: .seconds(599))
        #expect(calls.value == 1)
        pair.test.advance(clock, by: .seconds(1))
        #expect(calls.value == 2)
    }

    @Test("the schedule's rules as a state machine")
    func scheduleUnit() {
        var schedule = KeepAliveSchedule(budget: .seconds(10), pongTimeout: .seconds(10))
        let start = Instant(nanoseconds: 1_000_000_000_000)
        #expect(schedule.nextDeadline == nil)
        schedule.connected(serverInterval: 600, now: start)
        #expect(schedule.tick(now: start + .seconds(599)) == [])
        #expect(schedule.tick(now: start + .seconds(600)) == [.runHandler])
        schedule.handlerFinished()
        schedule.pingSent(now: start + .seconds(600))
        #expect(!schedule.canPing)
        #expect(schedule.tick(now: start + .seconds(610)) == [.pongOverdue])
        // An app interval longer than the server's applies; re-arming never delays a run.
        schedule.setAppInterval(.seconds(1200), now: start + .seconds(610))
        #expect(schedule.interval == .seconds(1200))
        #expect(schedule.nextRun == start + .seconds(1200))
        schedule.setAppInterval(.seconds(600), now: start + .seconds(700))
        #expect(schedule.nextRun == start + .seconds(1200))
    }
}

@Suite("PING on demand")
struct PingNowTests {
    @Test("pingNow sends one PING, reports the round trip, refuses a second one while outstanding, and leaves the schedule alone")
    func pingNow() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 600)
        defer { pair.shutdown() }
        let nextRun = pair.core.queue.sync { pair.core.keepAlive.nextRun }

        clock.advance(by: .seconds(30))
        #expect(pair.client.pingNow())
        #expect(!pair.client.pingNow(), "a PING is outstanding")
        #expect(try pair.peer.readFrame() == .ping)
        clock.advance(by: .milliseconds(25))
        try pair.peer.send(.pong)
        let answered = pair.recorder.first { if case .keepAliveAnswered = $0 { return true } else { return false } }
        #expect(answered == .keepAliveAnswered(roundTrip: .milliseconds(25)))
        #expect(pair.client.status.lastPongRoundTrip == .milliseconds(25))
        #expect(pair.core.queue.sync { pair.core.keepAlive.nextRun } == nextRun)
        #expect(pair.client.pingNow(), "answered: another may go")
    }

    @Test("pingNow without a connection sends nothing")
    func pingNowDisconnected() throws {
        let test = try TestClient(port: 9)
        defer { test.client.shutdown() }
        #expect(!test.client.pingNow())
    }

    @Test("an on-demand PING that is never answered counts as a dead connection")
    func unansweredPingNow() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock, keepAlive: 600)
        defer { pair.shutdown() }
        #expect(pair.client.pingNow())
        #expect(try pair.peer.readFrame() == .ping)
        pair.test.advance(clock, by: .seconds(10))
        #expect(pair.recorder.wait { events in
            events.contains { if case .connectionStateChanged(.waitingToReconnect(_, .keepAliveTimedOut)) = $0 { return true } else { return false } }
        })
    }
}
