import SignalingProtocol
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The store timeout holds when a commit never returns (a frozen or hung file system),
/// not only when it fails: loop 0 refuses the sender at the deadline whatever the writer
/// thread is doing, and a message refused while its commit was stuck is undone when the
/// commit lands after all.
@Suite("A stalled store: a commit that does not return")
struct StoreStallTests {
    func isPong(_ frame: Frame) -> Bool? { if case .pong = frame { true } else { nil } }

    @Test("a hung commit: the sender is refused at the store timeout, others are served, the refused messages are undone, also across a restart")
    func hungCommit() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let logs = try TemporaryDirectory("store-stall")
        let logFD = open(logs.file("server.log"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        #expect(logFD >= 0)
        defer { close(logFD) }
        let logger = Logger(level: .info, fileDescriptor: logFD, clock: clock)

        do {
            let server = try TestServer(store: store, clock: clock, logger: logger) {
                $0.storeTimeout = .seconds(5)
                // The writer gathers for 50 ms once woken, so m1 and m2 (one write) share a commit.
                $0.commitInterval = .milliseconds(50)
            }
            // bob has a device but no connection: m1 is stored for it. dave has no device: m2 is held.
            do { _ = try server.connect(user: "bob") }
            let (alice, _) = try server.connect(user: "alice")
            let (carol, _) = try server.connect(user: "carol")
            try server.waitFor("the devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 3 }
            #expect(try carol.request(900, Request.identifiedMessage("warm-up", to: "alice")).isOK)
            let warmUp = try alice.nextEvent().seq
            try alice.ack(warmUp)
            // Nothing else may be on its way to the store: the commit that hangs must be m1's and m2's.
            // (The snapshot cannot show it: the event and its acknowledgement may cancel out
            // in one batch, and a device's reserved numbers count as acknowledged anyway.)
            try server.waitFor("alice's ack to be committed") { _ in
                store.appliedChanges.contains { if case .acknowledge("alice", _, let through) = $0 { through >= warmUp } else { false } }
            }

            store.closeGate()
            defer { store.openGate() }  // else a failure below would leave the server unable to stop
            try alice.sendRaw(
                FrameEncoder.encode(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
                    + FrameEncoder.encode(.request(id: 2, Request.identifiedMessage("m2", to: "dave"))))
            try server.waitFor("the commit to hang") { _ in store.appliesWaitingAtGate == 1 }
            let hung = store.lastAttempt
            #expect(hung.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } })
            #expect(hung.contains { if case .holdForUser("dave", _) = $0 { true } else { false } })

            // Just before the deadline: no answer yet. The commit has hung for longer than
            // the stall threshold: new messages are refused at once, pings are answered,
            // a new device can connect.
            try server.advance(by: .milliseconds(4_900))
            #expect(try alice.staysSilent(for: .milliseconds(30)), "refused before the store timeout")
            #expect(try carol.request(901, Request.identifiedMessage("c1", to: "alice")).errorCode == .storeUnavailable)
            try carol.send(.ping)
            try carol.expect(timeout: .seconds(2), "PONG", isPong)
            let (erin, _) = try server.connect(user: "erin")
            try erin.send(.ping)
            try erin.expect(timeout: .seconds(2), "PONG", isPong)

            // Just after it: both are refused, though the writer is still stuck in the commit.
            try server.advance(by: .milliseconds(200))
            #expect(try alice.reply(to: 1).errorCode == .storeUnavailable)
            #expect(try alice.reply(to: 2).errorCode == .storeUnavailable)
            #expect(store.appliesWaitingAtGate == 1)
            try carol.send(.ping)
            try carol.expect(timeout: .seconds(2), "PONG", isPong)

            // The write returns: the commit lands with m1 and m2 in it, and the next one
            // undoes them (no OK is sent for them).
            store.openGate()
            try server.waitFor("the refused messages to be withdrawn") { _ in
                store.appliedChanges.contains { if case .withdrawHeld("dave", _) = $0 { true } else { false } }
            }
            let landed = store.appliedChanges
            #expect(landed.contains { if case .holdForUser("dave", _) = $0 { true } else { false } })
            #expect(landed.contains { if case .appendEvent("bob", _, _) = $0 { true } else { false } })
            let snapshot = try store.loadSnapshot()
            #expect(snapshot.devices.first { $0.userID == "bob" }?.events.isEmpty == true)
            #expect(snapshot.held["dave"] == nil)
            #expect(!snapshot.messageIDs.contains { $0.messageID == "m1" || $0.messageID == "m2" })
            #expect(try alice.staysSilent(for: .milliseconds(30)), "an OK after the refusal")

            // Later messages work.
            #expect(try carol.request(902, Request.identifiedMessage("c2", to: "alice")).isOK)
            guard case .message(let delivered) = try alice.nextEvent().event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "c2")
            let log = (try? String(contentsOfFile: logs.file("server.log"), encoding: .utf8)) ?? ""
            #expect(log.contains("level=warn event=store_stalled"), "\(log)")
            #expect(log.contains("event=store_stall_ended"), "\(log)")
        }

        // Restart on the same store: the refused messages are not delivered, and their ids
        // are free, so the sender's retry of m1 is a new message, delivered once.
        let server = try TestServer(store: store, clock: clock)
        let (bob, _) = try server.connect(user: "bob")
        let (dave, _) = try server.connect(user: "dave")
        #expect(try bob.staysSilent(for: .milliseconds(50)), "a refused message delivered after a restart")
        #expect(try dave.staysSilent(for: .milliseconds(50)), "a refused held message delivered after a restart")
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(3, Request.identifiedMessage("m1", to: "bob")).isOK)
        guard case .message(let retried) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
        #expect(retried.messageID == "m1")
        #expect(try bob.staysSilent(for: .milliseconds(30)))
    }
}

/// The real `voipserver` with its SQLite store on a file system that freezes
/// (`fsfreeze -f`): the store's writes block until the thaw, as on a hung disk.
@Suite(
    "A frozen data directory (voipserver subprocess, SQLite, fsfreeze)", .serialized,
    .enabled(if: FreezableFileSystem.unavailableReason == nil,
             "\(FreezableFileSystem.unavailableReason ?? "")"))
struct FrozenDataDirectoryTests {
    @Test("frozen: a sender is refused within --store-timeout, store_stalled is logged; thawed: messages are accepted, the refused one is never delivered")
    func frozenDataDirectory() throws {
        let storeTimeout: Duration = .seconds(2)
        let fileSystem = try FreezableFileSystem(sizeMegabytes: 32)
        defer { fileSystem.tearDown() }  // runs last: thaws (if still frozen) and unmounts
        let data = fileSystem.mountPoint + "/data"
        var server: ServerProcess? = try ServerProcess([
            "--data-dir", data, "--store-timeout", "\(Int(storeTimeout.seconds))",
        ])
        // Runs first, even when an expectation throws: the thaw comes before the server is
        // killed (a process blocked on a frozen file system cannot die before the thaw).
        defer {
            fileSystem.thaw()
            server = nil
        }
        let port = server!.port
        do {  // bob's device exists, offline: a message for it waits in the store
            let bob = try TestClient(port: port)
            try bob.hello(user: "bob", device: "phone")
        }
        let alice = try TestClient(port: port)
        try alice.hello(user: "alice", device: "laptop")
        #expect(try alice.request(1, Request.identifiedMessage("before", to: "bob")).isOK)

        try fileSystem.freeze()
        let clock = SystemClock()
        let sent = clock.now()
        try alice.send(.request(id: 2, Request.identifiedMessage("frozen", to: "bob")))
        let refusal = try alice.reply(to: 2, timeout: storeTimeout + .seconds(3))
        let waited = clock.now() - sent
        #expect(refusal.errorCode == .storeUnavailable, "\(refusal)")
        #expect(waited >= storeTimeout, "refused after \(waited), before the store timeout")
        print("frozen data directory: storeUnavailable after \(waited)")
        // The commit is stalled by now: a new message is refused at once, and the log says so.
        let again = clock.now()
        #expect(try alice.request(3, Request.identifiedMessage("frozen-2", to: "bob")).errorCode == .storeUnavailable)
        let refusedAtOnce = clock.now() - again
        #expect(refusedAtOnce < .seconds(1))
        print("frozen data directory: refused \(refusedAtOnce) after sending while the commit is stalled")
        let log = server!.log
        #expect(log.contains("level=warn event=store_stalled"), "\(log)")

        fileSystem.thaw()
        let thawed = clock.now()
        // Accepted again once the stalled commit has returned (and its refused message was withdrawn).
        let deadline = clock.now() + .seconds(10)
        var id: UInt32 = 10
        var accepted = false
        while !accepted && clock.now() < deadline {
            let reply = try alice.request(id, Request.identifiedMessage("after", to: "bob"))
            accepted = reply.isOK
            if !accepted { #expect(reply.errorCode == .storeUnavailable); id += 1 }
        }
        #expect(accepted, "not accepted within 10 s of the thaw")
        print("frozen data directory: accepted again \(clock.now() - thawed) after the thaw")
        #expect(server!.log.contains("event=store_stall_ended"))

        // After a clean restart on the same data directory bob gets what was accepted, and
        // never the refused message.
        #expect(server!.terminate().map { ($0 >> 8) & 0xff } == 0)
        server = try ServerProcess(["--data-dir", data])
        let bob = try TestClient(port: server!.port)
        try bob.hello(user: "bob", device: "phone")
        var received: [String] = []
        while let (_, event) = try? bob.nextEvent(timeout: .milliseconds(500)) {
            if case .message(let delivered) = event { received.append(delivered.messageID) }
        }
        #expect(received == ["before", "after"])
    }
}
