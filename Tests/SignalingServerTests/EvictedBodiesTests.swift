import SignalingProtocol
import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// With a store, the body of a committed message that no connected device is about to
/// receive lives in the store only; the device that connects gets it back, whole.
@Suite("Message bodies in the store, not in memory")
struct EvictedBodiesTests {
    /// Receives m1...m`count` whole and acknowledges them.
    func receive(_ client: TestClient, count: Int) throws {
        try client.ack(try client.receiveLargeMessages(count: count))
    }

    @Test("messages for a user nobody has used yet stay in the store; its first device gets them whole")
    func heldBodiesLeaveMemory() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (alice, _) = try server.connect(user: "alice")
        let count = 100
        for index in 1...count { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "ghost")).isOK) }
        // Each loop carries out its own shard's part of a commit's release and then sends
        // its OKs: alice's last OK may come before ghost's shard has let the bodies go.
        try server.waitFor("the held bodies to leave memory") { $0.bodiesEvicted == count }
        let held = server.server.statistics
        #expect(held.eventBytes < count * 1_000, "\(held.eventBytes) bytes in memory for \(count) held messages")
        let (ghost, _) = try server.connect(user: "ghost")
        try receive(ghost, count: count)
        #expect(server.server.statistics.bodiesRestored == count)
    }

    @Test("an offline device's backlog leaves memory; when it connects it gets all of it, batch after batch, in order")
    func offlineBacklogComesBack() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        do { _ = try server.connect(user: "bob") }
        try server.waitFor("bob to leave") { $0.establishedConnections == 0 }
        let (alice, _) = try server.connect(user: "alice")
        let count = 150  // more than one read-back
        for index in 1...count { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "bob")).isOK) }
        try server.waitFor("the backlog to leave memory") { $0.bodiesEvicted == count }
        #expect(server.server.statistics.eventBytes < count * 1_000)
        let (bob, _) = try server.connect(user: "bob")
        try receive(bob, count: count)
        #expect(server.server.statistics.bodiesRestored == count)
    }

    @Test("a connected device's messages stay in memory; a device that leaves with a backlog lets it go")
    func connectedDevicesKeepTheirBodies() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (bob, _) = try server.connect(user: "bob")
        let (alice, _) = try server.connect(user: "alice")
        for index in 1...5 { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "bob")).isOK) }
        #expect(server.server.statistics.bodiesEvicted == 0)
        for _ in 1...5 { _ = try bob.nextEvent() }  // read, never acknowledged
        _ = consume bob
        try server.waitFor("the backlog to leave memory") { $0.bodiesEvicted == 5 }
        let (again, _) = try server.connect(user: "bob")
        try receive(again, count: 5)
    }

    @Test("after a restart, stored events are not all loaded into memory to stay; devices get them whole")
    func restartEvicts() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock)
            do { _ = try server.connect(user: "bob") }
            let (alice, _) = try server.connect(user: "alice")
            let (carol, _) = try server.connect(user: "carol")
            for index in 1...20 { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "bob")).isOK) }
            for index in 1...10 { #expect(try carol.request(UInt32(index), LargeMessages.request(index, to: "newbie")).isOK) }
        }
        let server = try TestServer(store: store, clock: clock)
        #expect(server.server.statistics.eventBytes < 30 * 1_000)
        let (bob, _) = try server.connect(user: "bob")
        try receive(bob, count: 20)
        let (newbie, _) = try server.connect(user: "newbie")
        try receive(newbie, count: 10)
    }
}

/// The same with the real SQLite store, in the executable, where memory is measured.
@Suite("Message bodies in the store (voipserver subprocess, SQLite)")
struct EvictedBodiesProcessTests {
    @Test("300 messages of 60 KB to user ids nobody has used grow the server by far less than their 18 MB; each first device gets its message whole")
    func messagesToNobodyStayOnDisk() throws {
        let server = try ServerProcess(["--workers", "1"])
        let alice = try TestClient(port: server.port)
        _ = try alice.hello(user: "alice")
        let before = BackpressureProcessTests.residentBytes(of: server.process.pid)
        let count = 300, size = LargeMessages.size
        // One at a time: what is measured is what stays, not how much is in flight at once.
        for index in 1...count { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "ghost\(index)")).isOK) }
        let grown = BackpressureProcessTests.residentBytes(of: server.process.pid) - before
        #expect(grown < count * size / 3, "RSS grew by \(grown) bytes for \(count * size) bytes of held messages")
        for index in [1, 150, 300] {
            let ghost = try TestClient(port: server.port)
            _ = try ghost.hello(user: "ghost\(index)")
            guard case .message(let message) = try ghost.nextEvent(timeout: .seconds(10)).event else {
                Issue.record("ghost\(index) got no message"); return
            }
            #expect(message.messageID == "m\(index)" && message.body == LargeMessages.body(index))
        }
    }
}
