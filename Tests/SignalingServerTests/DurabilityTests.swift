import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// The server with a durable store (a reference model of the SQLite store here; the
/// SQLite store itself is tested in its own suite and end to end with kill -9).
@Suite("Durable store integration")
struct DurabilityTests {
    /// Connects alice and bob and waits until both devices, and the sequence numbers
    /// reserved for them, are committed, so that a commit failure the test sets up next
    /// concerns only what it does afterwards (else the failure of their own commit would
    /// refuse the test's first message at once).
    func connectStored(
        _ server: TestServer, _ store: ModelEventStore
    ) throws -> (alice: TestClient, bob: TestClient, bobSession: SessionID) {
        let (alice, _) = try server.connect(user: "alice")
        let (bob, welcome) = try server.connect(user: "bob")
        try server.waitFor("both devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 2 }
        // The writer confirms a batch's reservations after the batch; the OK of a later
        // message (held for a user with no device) comes after that.
        #expect(try alice.request(999, Request.identifiedMessage("warm-up", to: "nobody")).isOK)
        return (alice, bob, welcome.sessionID)
    }

    @Test("a message is accepted only once committed, and is stored until acknowledged")
    func acceptedAfterCommit() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        #expect(store.events(user: "bob", device: "d1").map(\.seq) == [1])
        let (seq, _) = try bob.nextEvent()
        try bob.ack(seq)
        guard case .messageDelivered = try alice.nextEvent().event else { Issue.record("no receipt"); return }
        // The acknowledgement removed it from the store (the receipt is alice's now).
        try server.waitFor("the ack to be committed") { _ in store.events(user: "bob", device: "d1").isEmpty }
        #expect(store.events(user: "alice", device: "d1").map(\.type) == [FrameType.messageDelivered.rawValue])
    }

    @Test("--delivery after-commit: while the store cannot commit, nothing is delivered, and the sender is refused after the store timeout")
    func storeFailure() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) {
            $0.storeTimeout = .seconds(5)
            $0.delivery = .afterCommit
        }
        let (alice, bob, _) = try connectStored(server, store)
        store.failCommits(with: StoreError(.full, "database or disk is full"))

        try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        try server.waitFor("a failed commit") { _ in store.failedAttempts > 0 }
        #expect(try alice.staysSilent(for: .milliseconds(30)), "accepted before the commit")
        #expect(try bob.staysSilent(for: .milliseconds(30)), "delivered before the commit")

        // While the store is failing, new sends are refused at once.
        #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).errorCode == .storeUnavailable)

        // The store timeout passes: the first send is refused too, and cancelled.
        server.clock.advance(by: .seconds(6))
        let refusal = try alice.reply(to: 1)
        #expect(refusal.errorCode == .storeUnavailable)

        // Space returns: the store recovers, the same message is accepted and delivered once.
        store.failCommits(with: nil)
        try server.waitFor("the store to recover", timeout: .seconds(10)) { _ in store.committedBatches > 0 }
        let retried = try alice.requestUntilAccepted(firstID: 3, Request.identifiedMessage("m1", to: "bob"))
        #expect(retried)
        guard case .message(let delivered) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
        #expect(delivered.messageID == "m1")
        #expect(try bob.staysSilent(for: .milliseconds(30)), "the cancelled copy must never be delivered")
    }

    @Test("--delivery immediate: a connected device gets the message before its commit, the sender's OK waits for it")
    func deliveredBeforeCommit() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.storeTimeout = .seconds(5) }
        let (alice, bob, _) = try connectStored(server, store)
        store.failCommits(with: StoreError(.full, "database or disk is full"))

        // Written to bob at once; alice hears nothing until the commit succeeds or times out.
        try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        guard case .message(let early) = try bob.nextEvent().event else { Issue.record("not delivered at once"); return }
        #expect(early.messageID == "m1")
        try server.waitFor("a failed commit") { _ in store.failedAttempts > 0 }
        #expect(try alice.staysSilent(for: .milliseconds(30)), "accepted before the commit")

        // Once commits fail, events wait for their commit again: m2 is refused at once and
        // never reaches bob.
        #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).errorCode == .storeUnavailable)
        #expect(try bob.staysSilent(for: .milliseconds(30)), "delivered while the store is failing")
        server.clock.advance(by: .seconds(6))
        #expect(try alice.reply(to: 1).errorCode == .storeUnavailable)
        #expect(store.events(user: "bob", device: "d1").isEmpty)
    }

    @Test("--delivery immediate: events acknowledged before their commit never reach the store")
    func acknowledgedBeforeCommit() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (alice, bob, _) = try connectStored(server, store)
        // Hold the commit back so that the event and its acknowledgement meet in one batch.
        store.failCommits(with: StoreError(.io, "held back by the test"))
        try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        let (seq, _) = try bob.nextEvent()
        try bob.ack(seq)
        try server.waitFor("the ack to reach the writer") { _ in
            store.lastAttempt.contains { if case .acknowledge("bob", _, _) = $0 { true } else { false } }
        }
        store.failCommits(with: nil)
        #expect(try alice.reply(to: 1).isOK)
        guard case .messageDelivered = try alice.nextEvent().event else { Issue.record("no receipt"); return }
        let inserted = store.appliedChanges.filter {
            if case .appendEvent("bob", _, _) = $0 { true } else { false }
        }
        #expect(inserted.isEmpty, "bob's event was written although acknowledged in the same batch")
        let snapshot = try store.loadSnapshot()
        let stored = try #require(snapshot.devices.first { $0.userID == "bob" })
        // Every reserved number without an event counts as acknowledged (StoredDevice.ackedSeq).
        #expect(stored.events.isEmpty && stored.ackedSeq == SwitchboardState.reservationWindow)
        #expect(stored.lastSeq == SwitchboardState.reservationWindow, "the numbers reserved at the handshake")
    }

    @Test("--delivery immediate: after a crash lost delivered events, the device resumes and no number is used twice")
    func resumeAfterLostEvents() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let session: SessionID
        do {
            let server = try TestServer(store: store, clock: clock)
            let (alice, bob, bobSession) = try connectStored(server, store)
            session = bobSession
            // The "crash": nothing is committed any more; bob has seen event 1 anyway.
            store.failCommits(with: StoreError(.io, "the server is about to crash"))
            try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
            #expect(try bob.nextEvent().seq == 1)
        }
        store.failCommits(with: nil)
        #expect(store.events(user: "bob", device: "d1").isEmpty, "the crashed server committed m1 after all")

        // The restarted server never stored event 1, but it knows number 1 was reserved.
        // Carol writes to bob before he is back: her message must not take number 1, which
        // bob would drop as already seen.
        let server = try TestServer(store: store, clock: clock)
        let (carol, _) = try server.connect(user: "carol")
        #expect(try carol.request(1, Request.identifiedMessage("from carol", to: "bob")).isOK)
        let bob = try server.client()
        let welcome = try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 1))
        #expect(welcome.resumed)
        // The reserved numbers have no events behind them: they count as acknowledged.
        #expect(welcome.ackedSeq == SwitchboardState.reservationWindow)
        let first = try bob.nextEvent()
        #expect(first.seq == 1 + SwitchboardState.reservationWindow)
        guard case .message(let fromCarol) = first.event else { Issue.record("not a message"); return }
        #expect(fromCarol.messageID == "from carol")
        // Alice never got her OK and sends m1 again: it is new to this server, and gets a
        // number bob has not seen (the client library drops the copy by message id).
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        let (seq, event) = try bob.nextEvent()
        #expect(seq == first.seq + 1)
        guard case .message(let again) = event else { Issue.record("not a message"); return }
        #expect(again.messageID == "m1")
    }

    @Test("--delivery immediate: only reserved numbers go out before their commit; a device that outruns its reservation gets a bigger one")
    func reservationBoundsEarlyDelivery() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (alice, bob, _) = try connectStored(server, store)  // reserved: 1...64
        let window = SwitchboardState.reservationWindow
        store.delayCommits(by: .seconds(2))
        for index in 1...(window + 6) {
            try alice.send(.request(id: UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")))
        }
        for expected in 1...window { #expect(try bob.nextEvent().seq == expected) }
        #expect(try bob.staysSilent(for: .milliseconds(50)), "an unreserved number went out before its commit")
        // The rest follow their commit.
        for expected in (window + 1)...(window + 6) { #expect(try bob.nextEvent(timeout: .seconds(20)).seq == expected) }
        store.delayCommits(by: .zero)
        for index in 1...(window + 6) { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(20)).isOK) }
        // The device was outrun, so its next reservation reaches further.
        try server.waitFor("a wider reservation committed") { _ in
            (try? store.loadSnapshot().devices.first { $0.userID == "bob" }?.lastSeq).flatMap { $0 } ?? 0 >= window + 1 + 2 * window
        }
    }

    @Test("a resume point beyond the last number handed out is refused, and breaks nothing")
    func resumeFarBeyondIsRefused() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store)
        let (alice, _, bobSession) = try connectStored(server, store)
        for lastReceived: UInt64 in [.max, (1 << 20) + 1] {
            let liar = try server.client()
            try liar.send(.hello(Hello(userID: "bob", deviceID: "d1", resume: ResumePoint(sessionID: bobSession, lastReceivedSeq: lastReceived))))
            #expect(try liar.expectClose().code == .invalidSequence, "resume point \(lastReceived)")
        }
        // The store took nothing it cannot hold, and the server still delivers.
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        let bob = try server.client()
        #expect(try bob.hello(user: "bob", resume: ResumePoint(sessionID: bobSession, lastReceivedSeq: 0)).resumed)
        #expect(try bob.nextEvent().seq == 1)
    }

    @Test("operations within the commit interval share one commit; their OKs follow it")
    func commitInterval() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.commitInterval = .milliseconds(400) }
        let (alice, bob, _) = try connectStored(server, store)
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        _ = try bob.nextEvent()
        let before = store.committedBatches
        // One at a time: each is delivered (so the server has handled it, and handed its
        // unit to the writer) before the next is sent. Without the interval each would be
        // a commit of its own.
        for index in 2...6 {
            try alice.send(.request(id: UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")))
            guard case .message(let delivered) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "m\(index)")
        }
        for index in 2...6 { #expect(try alice.reply(to: UInt32(index)).isOK) }
        #expect(store.committedBatches - before == 1)
    }

    @Test("a commit's release and OKs are carried out by a loop: the store writer does not take the routing lock for them")
    func commitsReleasedByLoops() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.delivery = .afterCommit }
        let (alice, bob, _) = try connectStored(server, store)
        let holdsBefore = server.server.routingLockHoldsOffLoops
        // After-commit delivery: each event goes out only once its commit is released.
        for index in 1...5 {
            #expect(try alice.request(UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")).isOK)
            let (seq, event) = try bob.nextEvent()
            guard case .message(let delivered) = event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "m\(index)")
            try bob.ack(seq)
        }
        #expect(server.server.routingLockHoldsOffLoops == holdsBefore)
    }

    @Test("the OKs of one commit reach each of several senders in the order of their requests")
    func oneCommitsOKsKeepEachSendersOrder() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.commitInterval = .milliseconds(400) }
        let (alice, bob, _) = try connectStored(server, store)
        let (carol, _) = try server.connect(user: "carol")
        #expect(try carol.request(999, Request.identifiedMessage("warm-up", to: "nobody")).isOK)
        let before = store.committedBatches
        // Interleaved, each delivered before the next is sent: one commit, whose OKs the
        // loop receives as one batch and writes grouped by connection.
        for index in 1...5 {
            for (sender, name) in [(alice, "a"), (carol, "c")] {
                try sender.send(.request(id: UInt32(index), Request.identifiedMessage("\(name)\(index)", to: "bob")))
                guard case .message(let delivered) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
                #expect(delivered.messageID == "\(name)\(index)")
            }
        }
        for sender in [alice, carol] {
            var order: [UInt32] = []
            while order.count < 5, let frame = try sender.next() {
                if case .ok(let requestID, _) = frame { order.append(requestID) }
            }
            #expect(order == [1, 2, 3, 4, 5])
        }
        #expect(store.committedBatches - before == 1)
    }

    @Test("after a slow commit the writer gathers at least as long as it took, so a slow store gets bigger batches")
    func slowCommitsGatherLonger() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.commitInterval = .zero }
        let (alice, bob, _) = try connectStored(server, store)
        store.delayCommits(by: .milliseconds(500))
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)  // a commit of 500 ms
        _ = try bob.nextEvent()
        let before = store.committedBatches
        for index in 2...6 {
            try alice.send(.request(id: UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")))
            _ = try bob.nextEvent()
        }
        for index in 2...6 { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(10)).isOK) }
        // Without gathering, m2 would be committed alone at once, the rest after it.
        #expect(store.committedBatches - before == 1)
    }

    @Test("after a restart, a device resumes and gets every unacknowledged event exactly once")
    func restart() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let session: SessionID
        do {
            let server = try TestServer(store: store, clock: clock)
            let (alice, _) = try server.connect(user: "alice")
            let (bob, welcome) = try server.connect(user: "bob")
            session = welcome.sessionID
            for index in 1...4 { #expect(try alice.request(UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")).isOK) }
            for _ in 1...4 { _ = try bob.nextEvent() }
            try bob.ack(2)  // processed m1 and m2; m3 and m4 seen but not acknowledged
            try server.waitFor("the ack to be committed") { _ in store.events(user: "bob", device: "d1").count == 2 }
            #expect(try alice.request(9, Request.identifiedMessage("m5", to: "bob")).isOK)  // while bob... still connected
        }
        // Numbers the old server reserved for bob (it may have handed them out).
        let reserved = try #require(try store.loadSnapshot().devices.first { $0.userID == "bob" }).lastSeq
        #expect(reserved >= 5)
        // A new server on the same store: bob resumes where it left off.
        let server = try TestServer(store: store, clock: clock)
        let bob = try server.client()
        let welcome = try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 3))
        #expect(welcome.resumed)
        #expect(welcome.ackedSeq == 3)
        var received: [UInt64: String] = [:]
        for _ in 0..<2 {
            let (seq, event) = try bob.nextEvent()
            if case .message(let message) = event { received[seq] = message.messageID }
        }
        #expect(received == [4: "m4", 5: "m5"])
        #expect(try bob.staysSilent(for: .milliseconds(30)))

        // Message ids are remembered across the restart: a re-send is not delivered again.
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, Request.identifiedMessage("m5", to: "bob")).isOK)
        #expect(try bob.staysSilent(for: .milliseconds(30)))
        // New events continue after the numbers reserved before the restart (a device may
        // have seen reserved numbers whose events the store never got).
        #expect(try alice.request(2, Request.identifiedMessage("m6", to: "bob")).isOK)
        #expect(try bob.nextEvent().seq == reserved + 1)
    }

    @Test("after a crash, numbers reserved but never used are not pending: a device with a grown reservation still takes messages")
    func reservedNumbersAreNotPendingAfterACrash() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let window = SwitchboardState.reservationWindow
        let limit = 100
        let sent = Int(window) + 6
        let session: SessionID
        do {
            let server = try TestServer(store: store, clock: clock) {
                $0.maxPendingEvents = limit
                $0.maxPendingPerSender = limit
            }
            let (alice, bob, bobSession) = try connectStored(server, store)
            session = bobSession
            // Bob (connected, reading, acknowledging nothing) outruns his reservation while commits are slow, so it grows to 2 windows.
            store.delayCommits(by: .milliseconds(300))
            for index in 1...sent { try alice.send(.request(id: UInt32(index), Request.identifiedMessage("m\(index)", to: "bob"))) }
            for index in 1...sent { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(20)).isOK) }
            for expected in 1...UInt64(sent) { #expect(try bob.nextEvent().seq == expected) }
            store.delayCommits(by: .zero)
            try server.waitFor("the wider reservation to be committed") { _ in
                (try? store.loadSnapshot().devices.first { $0.userID == "bob" }?.lastSeq).flatMap { $0 } ?? 0 > UInt64(limit)
            }
            // The crash: bob acknowledged nothing, and nothing more is committed.
            store.failCommits(with: StoreError(.io, "the server is about to crash"))
        }
        store.failCommits(with: nil)
        let stored = try #require(try store.loadSnapshot().devices.first { $0.userID == "bob" })
        #expect(stored.events.count == sent && stored.lastSeq > UInt64(limit))
        #expect(stored.lastSeq <= UInt64(sent) + 2 * window, "a reservation reaches one (grown) window past the last number assigned")

        // More numbers are reserved than --max-pending allows events, yet only the stored
        // events are pending: carol's message is accepted.
        let server = try TestServer(store: store, clock: clock) {
                $0.maxPendingEvents = limit
                $0.maxPendingPerSender = limit
            }
        let (carol, _) = try server.connect(user: "carol")
        #expect(try carol.request(1, Request.identifiedMessage("from carol", to: "bob")).isOK)
        let bob = try server.client()
        let welcome = try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))
        #expect(welcome.ackedSeq == 0 && welcome.lastSeq == stored.lastSeq + 1)
        for expected in 1...UInt64(sent) { #expect(try bob.nextEvent().seq == expected) }
        #expect(try bob.nextEvent().seq == stored.lastSeq + 1, "carol's message comes after the reserved numbers")
    }

    @Test("a sender's share of a recipient's queue survives a restart")
    func senderShareAcrossRestart() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock) { $0.maxPendingPerSender = 2 }
            do { _ = try server.connect(user: "bob") }
            let (alice, _) = try server.connect(user: "alice")
            for index in 1...2 { #expect(try alice.request(UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")).isOK) }
            for index in 1...2 { #expect(try alice.request(UInt32(10 + index), Request.identifiedMessage("h\(index)", to: "newbie")).isOK) }
        }
        let server = try TestServer(store: store, clock: clock) { $0.maxPendingPerSender = 2 }
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(3, Request.identifiedMessage("m3", to: "bob")).errorCode == .senderQuotaExceeded)
        #expect(try alice.request(13, Request.identifiedMessage("h3", to: "newbie")).errorCode == .senderQuotaExceeded)
    }

    @Test("a message held for a user with no device, claimed by its first device and then refused by the store timeout, is not delivered after a restart")
    func refusedAfterItsClaimIsWithdrawn() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock) { $0.storeTimeout = .seconds(5) }
            let (alice, _) = try server.connect(user: "alice")
            try server.waitFor("alice to be stored") { _ in (try? store.loadSnapshot().devices.count) == 1 }
            store.failCommits(with: StoreError(.io, "disk trouble"))
            try alice.send(.request(id: 1, Request.identifiedMessage("m1", to: "newbie")))
            try server.waitFor("a failed commit") { _ in store.failedAttempts > 0 }
            // Newbie's first device claims the held message while the store fails.
            let (newbie, _) = try server.connect(user: "newbie")
            #expect(try newbie.staysSilent(for: .milliseconds(30)), "delivered before its commit")
            server.clock.advance(by: .seconds(6))
            #expect(try alice.reply(to: 1).errorCode == .storeUnavailable)
            // The store recovers: what remains (the handshake, the claim) is committed.
            store.failCommits(with: nil)
            try server.waitFor("the store to recover", timeout: .seconds(10)) { _ in
                (try? store.loadSnapshot().devices.count) == 2
            }
            #expect(try alice.request(2, Request.identifiedMessage("warm-up", to: "nobody")).isOK)  // after the claim's commit
        }
        #expect(store.events(user: "newbie", device: "d1").isEmpty, "the refused message is stored for newbie")
        let server = try TestServer(store: store, clock: clock)
        let (newbie, _) = try server.connect(user: "newbie")
        #expect(try newbie.staysSilent(for: .milliseconds(50)), "the refused message was delivered after the restart")
    }

    @Test("messages for a user with no device yet are kept across a restart and delivered in order")
    func heldAcrossRestart() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock)
            let (alice, _) = try server.connect(user: "alice")
            for index in 1...3 { #expect(try alice.request(UInt32(index), Request.identifiedMessage("m\(index)", to: "newbie")).isOK) }
        }
        let server = try TestServer(store: store, clock: clock)
        let (newbie, _) = try server.connect(user: "newbie")
        #expect(try newbie.nextMessageIDs(3, acknowledging: false) == ["m1", "m2", "m3"])
    }

    @Test("a device that stays away longer than the event TTL is forgotten, with its events")
    func eventExpiry() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) {
            $0.sessionTTL = .seconds(3600)
            $0.eventTTL = .seconds(7200)
        }
        let (alice, _) = try server.connect(user: "alice")
        do { _ = try server.connect(user: "bob") }
        try server.waitFor("bob to leave") { $0.establishedConnections == 1 }
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        try server.advance(by: .seconds(7201))
        try server.waitFor("bob to be forgotten") { $0.eventsExpired == 1 }
        try server.waitFor("the removal to be committed") { _ in store.events(user: "bob", device: "d1").isEmpty }
        #expect(try store.loadSnapshot().devices.map(\.userID) == ["alice"])
    }
}
