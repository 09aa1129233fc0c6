import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import Testing

/// What one client can make the server hold is bounded: a sender's share of each
/// recipient's queue, its rate, and the server's memory budget. Each refusal has its own
/// error code; nothing refused was accepted, and other clients are not affected.
@Suite("Sender limits and the memory budget")
struct SenderLimitsTests {
    func message(_ id: String, to recipient: String, size: Int = 1) -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "t", body: [UInt8](repeating: 1, count: size)))
    }

    @Test("messages to user ids nobody uses count against the memory budget; past it they are refused with capacityExceeded, and accepted again once the memory is free")
    func memoryBudgetBoundsMessagesToNobody() throws {
        let budget = 2 << 20
        let server = try TestServer {
            $0.memoryBudget = budget
            $0.sessionTTL = .seconds(60)
            $0.eventTTL = .seconds(120)
        }
        let (mallory, _) = try server.connect(user: "mallory")
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        var accepted = 0
        var refusal: Frame?
        for index in 1...300 {
            let reply = try mallory.request(UInt32(index), message("m\(index)", to: "ghost\(index)", size: 60_000))
            if reply.isOK { accepted += 1 } else { refusal = reply; break }
        }
        #expect(refusal?.errorCode == .capacityExceeded)
        #expect(accepted >= 30 && accepted < 40, "a 2 MB budget holds about 34 messages of 60 KB")
        let statistics = server.server.statistics
        #expect(statistics.eventBytes <= budget && statistics.refusedCapacity == 1)
        // The budget is the server's: a large message from anyone is refused while it is
        // full; pings and existing sessions are not hurt.
        try bob.send(.ping)
        #expect(try bob.expect { frame -> Bool? in if case .pong = frame { return true } else { return nil } })
        #expect(try alice.request(1, message("big", to: "bob", size: 60_000)).errorCode == .capacityExceeded)

        // The held messages expire with the event TTL: the memory is free again.
        try server.advance(by: .seconds(121))
        try server.waitFor("the held messages to expire") { $0.eventsExpired >= accepted }
        #expect(server.server.statistics.eventBytes < 64 << 10)
        #expect(try alice.request(2, message("big", to: "bob", size: 60_000)).isOK)
    }

    @Test("one sender cannot fill a victim's queue: past its share it gets senderQuotaExceeded, others are still accepted, and acknowledgements give the share back")
    func senderShareOfOneQueue() throws {
        let server = try TestServer {
            $0.maxPendingEvents = 10
            $0.maxPendingPerSender = 3
        }
        let (victim, _) = try server.connect(user: "victim")
        let (mallory, _) = try server.connect(user: "mallory")
        let (alice, _) = try server.connect(user: "alice")
        for index in 1...3 { #expect(try mallory.request(UInt32(index), message("m\(index)", to: "victim")).isOK) }
        let refused = try mallory.request(4, message("m4", to: "victim"))
        #expect(refused.errorCode == .senderQuotaExceeded)
        #expect(server.server.statistics.refusedSenderQuota == 1)
        #expect(try alice.request(1, message("a1", to: "victim")).isOK, "another sender was refused")
        // The victim reads and acknowledges: mallory's share is free again.
        var last: UInt64 = 0
        for _ in 1...4 { last = try victim.nextEvent().seq }
        try victim.ack(last)
        try server.waitFor("the receipts") { $0.eventsQueued >= 8 }
        #expect(try mallory.request(5, message("m4", to: "victim")).isOK)
    }

    @Test("the share holds for a recipient with no device yet, and carries over to its first device")
    func senderShareOfHeldMessages() throws {
        let server = try TestServer { $0.maxPendingPerSender = 2 }
        let (mallory, _) = try server.connect(user: "mallory")
        for index in 1...2 { #expect(try mallory.request(UInt32(index), message("m\(index)", to: "newbie")).isOK) }
        #expect(try mallory.request(3, message("m3", to: "newbie")).errorCode == .senderQuotaExceeded)
        let (newbie, _) = try server.connect(user: "newbie")
        #expect(try newbie.nextEvent().seq == 1)
        #expect(try mallory.request(4, message("m3", to: "newbie")).errorCode == .senderQuotaExceeded, "the held share moved to the device")
        try newbie.ack(2)
        _ = try mallory.nextEvent()  // a receipt: the acknowledgement has been handled
        #expect(try mallory.request(5, message("m3", to: "newbie")).isOK)
    }

    @Test("a sender over --sender-rate gets rateLimited (bursts of twice the rate); its tokens come back with time")
    func senderRate() throws {
        let server = try TestServer { $0.senderRate = 5 }
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        for index in 1...10 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
        let refused = try alice.request(11, message("m11", to: "bob"))
        #expect(refused.errorCode == .rateLimited)
        #expect(server.server.statistics.refusedRate == 1)
        // A repeated message id is answered from the de-duplication window, not counted.
        #expect(try alice.request(12, message("m1", to: "bob")).isOK)
        try server.advance(by: .seconds(1))
        for index in 13...17 { #expect(try alice.request(UInt32(index), message("n\(index)", to: "bob")).isOK) }
        #expect(try alice.request(18, message("n18", to: "bob")).errorCode == .rateLimited)
    }
}

/// The share bookkeeping of the routing core, driven directly: counts are kept only for
/// queues long enough to matter, and are exact for those.
@Suite("Sender share bookkeeping (routing core, pure)")
struct SenderShareBookkeepingTests {
    @Test("share counts stay exact as queues grow past the floor and shrink under half of it, through random sends and acknowledgements")
    func sharesStayExact() throws {
        var effects: [SwitchboardEffect] = []
        var configuration = SwitchboardConfiguration()
        configuration.maxPendingEvents = 60
        configuration.maxPendingPerSender = 12
        let epoch = Instant(nanoseconds: 1_000_000_000_000)
        var state = SwitchboardState(configuration: configuration, epoch: epoch)
        let senders = try (1...3).map { index in
            try state.attach(
                userID: "s\(index)", deviceID: "d", resume: nil,
                connection: ConnectionRef(loop: 0, slot: UInt32(index), generation: 1), now: epoch, into: &effects).get().record
        }
        let recipients = try (1...2).map { index in
            try state.attach(
                userID: "r\(index)", deviceID: "d", resume: nil,
                connection: ConnectionRef(loop: 0, slot: UInt32(10 + index), generation: 1), now: epoch, into: &effects).get().record
        }
        var random = SystemRandomNumberGenerator()
        var next = 0
        var refusedByShare = 0
        var untracked = 0
        for iteration in 0..<4_000 {
            let recipient = recipients.randomElement(using: &random)!
            // Phases of growth (mostly sends) and of draining (mostly acknowledgements).
            let sendChance = (iteration / 500) % 2 == 0 ? 8 : 2
            let wasTracked = state.trackedShareQueues.count
            defer { if state.trackedShareQueues.count < wasTracked { untracked += 1 } }
            if Int.random(in: 0..<10, using: &random) < sendChance {
                next += 1
                let sender = senders.randomElement(using: &random)!
                let outcome = state.send(
                    OutgoingMessage(messageID: "m\(next)", recipient: recipient.userID, contentType: "t", body: [1]),
                    from: sender, now: epoch, into: &effects)
                if case .failure(let error) = outcome, error.code == .senderQuotaExceeded { refusedByShare += 1 }
            } else if recipient.queue.count > 0 {
                let through = recipient.ackedSeq + UInt64(Int.random(in: 1...max(1, recipient.queue.count / 4), using: &random))
                _ = state.ack(recipient, connection: recipient.connection!, through: min(through, recipient.lastSeq), into: &effects)
            }
            #expect(state.counters.pendingEvents == recipients.reduce(0) { $0 + $1.queue.count } + senders.reduce(0) { $0 + $1.queue.count })
            // Every tracked queue's counts equal a count made from scratch; no other queue
            // has entries.
            for recipient in recipients {
                let queue = ShareQueue.device(ObjectIdentifier(recipient))
                var actual: [String: Int] = [:]
                recipient.forEachEvent { if let receipt = $0.receipt { actual[receipt.sender, default: 0] += 1 } }
                for sender in senders {
                    let kept = state.pendingBySender[SenderShareKey(queue: queue, sender: sender.userID)]
                    if state.trackedShareQueues.contains(queue) {
                        #expect(kept == actual[sender.userID], "tracked queue of \(recipient.userID), sender \(sender.userID)")
                    } else {
                        #expect(kept == nil)
                        #expect(recipient.queue.count < state.shareFloor)
                    }
                }
            }
        }
        #expect(refusedByShare > 0, "the run never reached a share")
        #expect(untracked > 0, "no queue ever shrank back under half the floor")
    }
}
