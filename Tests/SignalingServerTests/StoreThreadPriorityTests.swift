import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `--store-thread-priority auto`: the store's threads at the idle scheduling policy while
/// the writer keeps up, raised by loop 0 to the normal policy at nice 19 as soon as work has
/// waited 50 ms and at their own nice value once it has waited 250 ms, stepped down from
/// there to nice 19 once it keeps up (unless connections are being set up), lowered again
/// after a second of keeping up.
@Suite("The store's threads at idle priority, raised while the writer falls behind")
struct StoreThreadPriorityTests {
    let start = Instant(nanoseconds: 1_000_000_000)

    @Test("work waiting 50 ms raises the threads once to nice 19; they go back to idle only after a whole second of keeping up")
    func transitions() {
        var priority = StoreThreadPriority()
        #expect(priority.observe(now: start, waited: .milliseconds(49)) == nil)
        #expect(priority.observe(now: start + .milliseconds(250), waited: .milliseconds(50)) == .raise(to: .nice19))
        #expect(priority.level == .nice19)
        #expect(priority.observe(now: start + .milliseconds(500), waited: .milliseconds(200)) == nil, "raised once, not at every tick")
        // Keeping up from 750 ms: not lowered before 1 s of it.
        #expect(priority.observe(now: start + .milliseconds(750), waited: .zero) == nil)
        #expect(priority.observe(now: start + .milliseconds(1_500), waited: .milliseconds(10)) == nil)
        // A relapse starts the second again.
        #expect(priority.observe(now: start + .milliseconds(1_600), waited: .milliseconds(60)) == nil)
        #expect(priority.observe(now: start + .milliseconds(1_850), waited: .zero) == nil)
        #expect(priority.observe(now: start + .milliseconds(2_800), waited: .zero) == nil)
        #expect(priority.observe(now: start + .milliseconds(2_850), waited: .zero) == .lower)
        #expect(priority.level == .idle && !priority.raised)
        #expect(priority.observe(now: start + .milliseconds(3_000), waited: .zero) == nil)
    }

    @Test("a writer that has not run at all for 20 ms (twice the commit interval, if longer) is starved, not slow: straight to its own nice value")
    func starved() {
        var priority = StoreThreadPriority()
        #expect(priority.observe(now: start, waited: .milliseconds(60), unrun: .milliseconds(19)) == .raise(to: .nice19), "it ran: slow")
        #expect(priority.observe(now: start + .milliseconds(20), waited: .milliseconds(80), unrun: .milliseconds(20)) == .raise(to: .normal))
        var fromIdle = StoreThreadPriority()
        #expect(fromIdle.observe(now: start, waited: .milliseconds(20), unrun: .milliseconds(20)) == .raise(to: .normal))
        #expect(fromIdle.observe(now: start + .milliseconds(10), waited: .milliseconds(10)) == .stepDown, "caught up: nice 19")
        // A writer that gathers for 30 ms (--commit-interval 30) leaves arrivals that long on purpose.
        var gathering = StoreThreadPriority(commitInterval: .milliseconds(30))
        #expect(gathering.observe(now: start, waited: .milliseconds(40), unrun: .milliseconds(40)) == nil)
        #expect(gathering.observe(now: start + .milliseconds(20), waited: .milliseconds(60), unrun: .milliseconds(60)) == .raise(to: .normal))
    }

    @Test("work still waiting at 250 ms raises the threads on to their own nice value; from idle, a wait that long goes there at once")
    func farBehind() {
        var priority = StoreThreadPriority()
        #expect(priority.observe(now: start, waited: .milliseconds(60)) == .raise(to: .nice19))
        #expect(priority.observe(now: start + .milliseconds(100), waited: .milliseconds(160)) == nil)
        #expect(priority.observe(now: start + .milliseconds(190), waited: .milliseconds(250)) == .raise(to: .normal))
        #expect(priority.level == .normal)
        #expect(priority.observe(now: start + .milliseconds(440), waited: .milliseconds(500)) == nil, "raised once")
        #expect(priority.observe(now: start + .milliseconds(500), waited: .milliseconds(60)) == nil, "still behind: stays")
        // During a ramp of connections it stays at its own nice value until back to idle.
        #expect(priority.observe(now: start + .milliseconds(600), waited: .zero, settingUp: true) == nil)
        #expect(priority.observe(now: start + .milliseconds(1_600), waited: .zero, settingUp: true) == .lower)
        #expect(priority.observe(now: start + .milliseconds(1_850), waited: .seconds(2)) == .raise(to: .normal))
    }

    @Test("caught up at its own nice value, the threads step down to nice 19 at once unless connections are being set up; starved again, back up at 50 ms")
    func stepsDownOnceCaughtUp() {
        var priority = StoreThreadPriority()
        #expect(priority.observe(now: start, waited: .milliseconds(50), unrun: .milliseconds(50)) == .raise(to: .normal))
        #expect(priority.observe(now: start + .milliseconds(250), waited: .milliseconds(10), settingUp: true) == nil, "a ramp: stays")
        #expect(priority.level == .normal)
        #expect(priority.observe(now: start + .milliseconds(500), waited: .milliseconds(10)) == .stepDown)
        #expect(priority.level == .nice19 && priority.raised)
        // At nice 19 it keeps up: back to idle after a second of it, counted from the step.
        #expect(priority.observe(now: start + .milliseconds(1_400), waited: .zero) == nil)
        #expect(priority.observe(now: start + .milliseconds(1_500), waited: .zero) == .lower)
        // Starved again after a step down: straight back to its own nice value.
        #expect(priority.observe(now: start + .milliseconds(2_000), waited: .milliseconds(50), unrun: .milliseconds(50)) == .raise(to: .normal))
        #expect(priority.observe(now: start + .milliseconds(2_250), waited: .zero) == .stepDown)
        #expect(priority.observe(now: start + .milliseconds(2_300), waited: .milliseconds(60), unrun: .milliseconds(60)) == .raise(to: .normal))
    }

    @Test("auto is the default of the library and of voipserver; the option sets it and refuses anything else")
    func option() throws {
        #expect(ServerConfiguration().storeThreadPriority == .auto)
        #expect(try ServerOptions.configuration(from: []).0.storeThreadPriority == .auto)
        #expect(try ServerOptions.configuration(from: ["--store-thread-priority", "normal"]).0.storeThreadPriority == .normal)
        #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--store-thread-priority", "idle"]) }
    }

    @Test("a commit that hangs raises the writer's thread to nice 19 at 50 ms and to its own nice value at 250 ms; once it returns and a second passes, back to idle")
    func hungCommitRaisesTheWriter() throws {
        let store = ModelEventStore()
        let server = try TestServer(workers: 1, store: store) { $0.storeThreadPriority = .auto }
        defer { store.openGate() }
        guard JoinableThread.mayRestoreFromIdle else {
            // Without CAP_SYS_NICE nor RLIMIT_NICE 20 auto leaves the threads alone.
            #expect(server.server.storeThreadsAtIdlePriority.allSatisfy { $0 == false })
            return
        }
        #expect(server.server.storeThreadsAtIdlePriority == [true])
        let (alice, bob) = try hangACommit(server, store)
        let own = nice(0)  // what the test process runs at: the store's threads inherited it
        try server.advance(by: .milliseconds(30))
        #expect(server.server.storeThreadPriorities == [.idle], "30 ms of waiting is not behind")
        try server.advance(by: .milliseconds(30))
        #expect(server.server.storeThreadPriorities == [.normal(nice: max(own, 19))], "raised to nice 19 once work has waited 50 ms")
        try server.advance(by: .milliseconds(100))
        #expect(server.server.storeThreadPriorities == [.normal(nice: max(own, 19))], "160 ms: still nice 19")
        try server.advance(by: .milliseconds(100))
        #expect(server.server.storeThreadPriorities == [.normal(nice: own)], "260 ms: raised to the nice value it started with")

        store.openGate()
        #expect(try alice.reply(to: 1).isOK)
        _ = try bob.nextEvent()
        // Loop 0 first sees the writer keeping up at the latest 10 ms on (a tick at the
        // same time, between the OK and this move, may see it first): down to nice 19.
        try server.advance(by: .milliseconds(10))
        #expect(server.server.storeThreadPriorities == [.normal(nice: max(own, 19))], "stepped down once it kept up")
        try server.advance(by: .milliseconds(900))
        #expect(server.server.storeThreadPriorities == [.normal(nice: max(own, 19))], "0.9 s of keeping up is not enough")
        try server.advance(by: .milliseconds(110))
        #expect(server.server.storeThreadPriorities == [.idle], "back to idle after a second of keeping up")
        let metrics = server.server.storeThreadPriorityCounts
        #expect(metrics.raises == 1 && metrics.raisesToNormal == 1 && metrics.idle)
    }

    @Test("raised during a ramp of handshakes, the writer stays at its own nice value until the ramp is over, then steps down to nice 19")
    func staysRaisedThroughARamp() throws {
        let store = ModelEventStore()
        let server = try TestServer(workers: 1, store: store) { $0.storeThreadPriority = .auto }
        defer { store.openGate() }
        guard JoinableThread.mayRestoreFromIdle else { return }  // the first test covers the unprivileged case
        let (alice, bob) = try hangACommit(server, store)
        // 80 handshakes within 300 ms of the clock (with alice's and bob's: 273 a second).
        var devices: [TestClient] = []
        for index in 0..<80 { devices.append(try server.connect(user: "ramp\(index)").0) }
        let own = nice(0)
        try server.advance(by: .milliseconds(300))
        #expect(server.server.storeThreadPriorities == [.normal(nice: own)], "300 ms behind: its own nice value")
        store.openGate()
        #expect(try alice.reply(to: 1).isOK)
        _ = try bob.nextEvent()
        // The writer's gathering runs on the real clock: let it take the ramp's units
        // before the manual clock moves on, or they count as work no pass has taken.
        try server.waitFor("the ramp's devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 82 }
        try server.advance(by: .zero)
        #expect(server.server.storeThreadPriorities == [.normal(nice: own)], "kept up, but connections were being set up")
        try server.advance(by: .milliseconds(250))
        try server.advance(by: .milliseconds(250))
        #expect(server.server.storeThreadPriorities == [.normal(nice: max(own, 19))], "no handshake since: stepped down")
        #expect(devices.count == 80)
    }

    @Test("a message waiting 50 ms for its commit raises the writer at loop 0's next callback, not only at its next tick")
    func raisedBetweenTicks() throws {
        let store = ModelEventStore()
        // Ticks a second apart (the longest allowed): the raise comes from a callback unless a
        // tick falls in the few ms between the clock move and the PING.
        let server = try TestServer(workers: 1, store: store) { $0.storeThreadPriority = .auto; $0.tickInterval = .seconds(1) }
        defer { store.openGate() }
        guard JoinableThread.mayRestoreFromIdle else { return }  // the first test covers the unprivileged case
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        store.closeGate()
        try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        let deadline = SystemClock().now() + .seconds(5)
        while store.appliesWaitingAtGate != 1 {
            #expect(SystemClock().now() < deadline, "the commit did not reach the store")
            if SystemClock().now() >= deadline { return }
            usleep(1_000)
        }
        server.clock.advance(by: .milliseconds(60))
        #expect(server.server.storeThreadsAtIdlePriority == [true], "no callback since the clock moved")
        try alice.send(.ping)
        _ = try alice.expect(timeout: .seconds(2), "PONG") { if case .pong = $0 { true } else { nil } }
        // The PONG goes out inside the callback; loop 0 looks at the writer right after it.
        let raisedBy = SystemClock().now() + .milliseconds(200)
        while server.server.storeThreadsAtIdlePriority != [false] && SystemClock().now() < raisedBy { usleep(1_000) }
        #expect(server.server.storeThreadsAtIdlePriority == [false], "raised by the PING's callback")
    }

    /// Connects alice and bob, and leaves a message from alice to bob hanging in its commit
    /// (the store's gate closed; the caller opens it).
    private func hangACommit(_ server: TestServer, _ store: ModelEventStore) throws -> (alice: TestClient, bob: TestClient) {
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        try server.waitFor("the devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 2 }
        store.closeGate()
        try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        try server.waitFor("the commit to hang") { _ in store.appliesWaitingAtGate == 1 }
        return (alice, bob)
    }

    @Test("--store-thread-priority normal leaves the writer at the normal policy, whatever the process may do")
    func normalLeavesThemAlone() throws {
        let server = try TestServer(workers: 1, store: ModelEventStore()) { $0.storeThreadPriority = .normal }
        #expect(server.server.storeThreadsAtIdlePriority == [false])
    }
}
