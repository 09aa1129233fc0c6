import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Testing

/// What a device relayed through a front sees when a connection table is full: the
/// home's, at a relayed `open` or when the connection moves to its user's home loop, and
/// the front's own at accept. The real tables hold 2^24 slots per loop; these tests make
/// them hold one (`SignalingServer.connectionSlotsPerLoop`).
@Suite("Full connection tables on a home and a front", .serialized)
struct FullTableTests {
    /// A user id starting with `prefix` whose routing shard, of 2, is `loop` (the home loop
    /// of its connections with two loops).
    func user(_ prefix: String, homedOn loop: Int) -> String {
        (0...).lazy.map { "\(prefix)\($0)" }.first { ShardMap.shard(of: $0, count: 2) == loop }!
    }

    @Test("a home with no slot for a relayed device sends CLOSE overloaded then .finish, at its open and at its move to its user's loop; the front's other device is unharmed and nothing is left counted")
    func homeTableFull() throws {
        let bed = try RelayTestBed(workers: 2, connectionSlotsPerLoop: 1)
        // Opens go round the loops: the 1st to loop 0, whence it moves to its user's loop 1.
        let (staying, _) = try bed.connectRelayed(user: user("staying", homedOn: 1))
        try bed.home.waitFor("the move to loop 1") { _ in bed.home.server.connectionsMovedPerLoop == [1, 0] }

        // The 2nd open goes to loop 1, whose one slot is taken.
        let refusedAtOpen = bed.front.open()
        try refusedAtOpen.send(.hello(Hello(userID: "refused", deviceID: "d1")))
        let atOpen = try refusedAtOpen.expectClose()
        #expect(atOpen.code == .overloaded && atOpen.message == "server full", "\(atOpen)")
        #expect(try refusedAtOpen.awaitEnding() == .finish)

        // The 3rd goes to loop 0 (free), and its user lives on loop 1: the move finds no slot.
        let refusedAtMove = bed.front.open()
        try refusedAtMove.send(.hello(Hello(userID: user("moving", homedOn: 1), deviceID: "d1")))
        let atMove = try refusedAtMove.expectClose()
        #expect(atMove.code == .overloaded && atMove.retryAfterMs == 5_000, "\(atMove)")
        #expect(try refusedAtMove.awaitEnding() == .finish)
        #expect(bed.front.framesAfterEnd(of: refusedAtOpen.connection) == 0 && bed.front.framesAfterEnd(of: refusedAtMove.connection) == 0)

        try staying.send(.ping)
        #expect(try staying.next() == .pong, "the device that has a slot is served as before")
        try bed.home.waitFor("only the staying device counted") { $0.relayedConnections == 1 && $0.openConnections == 1 }
        #expect(bed.home.server.statistics.relayedConnections == 1)

        // Its slot freed, loop 1 takes a device again (the 4th open goes to loop 1).
        staying.close()
        try bed.home.waitFor("the staying device gone") { $0.relayedConnections == 0 && $0.openConnections == 0 }
        let (next, _) = try bed.connectRelayed(user: user("next", homedOn: 1))
        try next.send(.ping)
        #expect(try next.next() == .pong)
    }

    @Test("a socket device whose move to its user's loop finds no slot gets CLOSE overloaded, as one that finds none at accept; the device that has the slot is unharmed")
    func socketMoveFindsNoSlot() throws {
        let server = try TestServer(workers: 2, connectionSlotsPerLoop: 1)
        let (staying, _) = try server.connect(user: user("staying", homedOn: 1))  // wherever accepted, it ends on loop 1
        // The kernel spreads connections over the loops (SO_REUSEPORT): each device lands on
        // loop 1 (full: refused at accept) or on loop 0 (moved, and refused by loop 1).
        // Both must look the same to the device; go on until one has taken the second way.
        let moved = server.server.connectionsMovedPerLoop[0]
        var attempts = 0
        while server.server.connectionsMovedPerLoop[0] == moved && attempts < 64 {
            attempts += 1
            let device = try server.client()
            try device.send(.hello(Hello(userID: user("moving", homedOn: 1), deviceID: "d\(attempts)")))
            let close = try device.expectClose()
            #expect(close.code == .overloaded && close.message == "server full", "attempt \(attempts): \(close)")
        }
        #expect(server.server.connectionsMovedPerLoop[0] > moved, "no device landed on loop 0 in \(attempts) attempts")
        try staying.send(.ping)
        #expect(try staying.next() == .pong)
        try server.waitFor("only the staying device open") { $0.openConnections == 1 }
    }

    @Test("a front whose own table is full refuses a device with CLOSE overloaded at accept; the home never hears of it and the front's other device is unharmed")
    func frontTableFull() throws {
        let front = try FrontFixture(connectionSlotsPerLoop: 1) { $0.workers = 1 }
        let relayed = try front.device()
        let open = try front.home.waitForOpen()

        let refused = try front.device()
        let frames = try readToEnd(refused)
        #expect(frames.count == 1 && closeCode(frames.first) == .overloaded, "\(frames)")
        #expect(front.home.frames.filter { if case .open = $0 { return true }; return false }.count == 1, "the refused device is never announced")

        front.sendFrames([.pong], to: open.connection)
        #expect(try relayed.read(timeout: .seconds(10)) == .pong)
        try relayed.send(.ping)
        try front.home.waitFor("the relayed device's ping") { _ in front.home.bytes(of: open.connection) == FrameEncoder.encode(.ping) }
    }
}
