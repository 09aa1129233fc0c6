import SignalingProtocol
import SignalingSupport
import Testing
@testable import SignalingServer

/// A message to a user with more devices than one hold takes (`SwitchboardState.fanOutChunk`),
/// driven one hold (one step) at a time, as `Switchboard.run` takes them, so each test can
/// look at the devices between two chunks and slip other requests in there.
@Suite("Fan-out in chunks: bounded holds, all or nothing, in order (routing core, pure)")
struct FanOutTests {
    static let chunk = SwitchboardState.fanOutChunk
    /// alice and fan share a shard; bob lives in the other.
    let alice = TwoShards.user("alice", onShard: 0)
    let fan = TwoShards.user("fan", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    func message(_ id: String, to recipient: String) -> OutgoingMessage {
        OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(id.utf8))
    }

    /// `count` connected devices of `user`, on slots from 100.
    func attachDevices(_ shards: inout TwoShards, _ user: String, count: Int) throws -> [DeviceRecord] {
        try (0..<count).map { try shards.attach(user, "d\($0)", slot: UInt32(100 + $0), at: 1) }
    }

    /// Steps in flight, run one hold at a time (first in, first out), with the answers
    /// they gave.
    struct Holds {
        var pending: [ShardStep] = []
        var replies: [Swift.Result<UInt64, RequestError>] = []
        var holds = 0
        /// What the last hold would have the loops do.
        var lastEffects: [SwitchboardEffect] = []

        /// Runs the next step; false when none is left.
        @discardableResult
        mutating func runOne(_ shards: inout TwoShards, at seconds: Double) -> Bool {
            guard !pending.isEmpty else { return false }
            let step = pending.removeFirst()
            lastEffects = []
            let outcome = shards.states[ShardMap.shard(of: step.user, count: 2)].handle(
                step, now: TwoShards.at(seconds), into: &lastEffects)
            if let reply = outcome.reply { replies.append(reply) }
            pending += outcome.next
            holds += 1
            return true
        }

        mutating func runAll(_ shards: inout TwoShards, at seconds: Double) {
            while runOne(&shards, at: seconds) {}
        }
    }

    /// `device` of `sender` sends message `id` to `recipient`: its first hold; the steps
    /// it hands on join `holds`. Returns the answer of the first hold, if it gave one.
    func send(
        _ shards: inout TwoShards, _ id: String, to recipient: String, from device: DeviceRecord, at seconds: Double,
        holds: inout Holds
    ) -> Swift.Result<UInt64, RequestError>? {
        var effects: [SwitchboardEffect] = []
        let shard = ShardMap.shard(of: device.userID, count: 2)
        switch shards.states[shard].send(message(id, to: recipient), from: device, now: TwoShards.at(seconds), into: &effects) {
        case .success(let acceptance):
            guard let handOff = acceptance.handOff else { return .success(acceptance.serverTime) }
            holds.pending.append(handOff)
            return nil
        case .failure(let refusal): return .failure(refusal)
        }
    }

    /// The message ids in `device`'s queue, in order.
    static func messageIDs(_ device: DeviceRecord) -> [String] {
        TwoShards.events(device).compactMap { event in
            guard case .message(let message) = event else { return nil }
            return message.messageID
        }
    }

    /// What `device`'s pump would write now.
    static func writable(_ state: SwitchboardState, _ device: DeviceRecord) -> [String] {
        var written: [String] = []
        _ = state.nextBatch(for: device, connection: device.connection!, after: device.ackedSeq, limit: 1000) { _, event in
            if case .message(let message)? = TwoShards.decode(event) { written.append(message.messageID) }
            return true
        }
        return written
    }

    @Test("a fan-out to more devices than a chunk reaches every device once, a chunk per hold, and is answered once at the end")
    func reachesEveryDevice() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let sender = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let devices = try attachDevices(&shards, fan, count: 2 * Self.chunk + 44)
        var holds = Holds()
        let firstHold = send(&shards, "m1", to: fan, from: sender, at: 2, holds: &holds)
        #expect(firstHold.map { _ in true } ?? false == false, "a hold of its own decides")
        var reached = 0
        while holds.runOne(&shards, at: 2) {
            let now = devices.filter { Self.messageIDs($0) == ["m1"] }.count
            #expect(now - reached <= Self.chunk, "one hold queued to \(now - reached) devices")
            reached = now
            #expect(holds.lastEffects.count <= Self.chunk, "one hold wakes at most a chunk")
        }
        #expect(reached == devices.count)
        #expect(holds.replies.count == 1 && TwoShards.isOK(holds.replies.first))
        // Three chunks queued, three woke the devices.
        #expect(holds.holds == 6)
        for device in devices { #expect(Self.writable(shards.states[0], device) == ["m1"]) }
        #expect(shards.states[0].counters.messagesAccepted == 1)
        #expect(shards.states[0].fanOuts.isEmpty && shards.states[0].activities[fan] == nil, "nothing left behind")
        // Acknowledged by one device: a receipt for the sender.
        let last = devices[devices.count - 1]
        _ = shards.states[0].ack(last, connection: last.connection!, through: last.lastSeq, into: &effects)
        guard case .messageDelivered(let id, _, _, _)? = TwoShards.events(sender).last else {
            Issue.record("no receipt"); return
        }
        #expect(id == "m1")
    }

    @Test("a device of a user whose fan-out is in progress is not shown it: its pump stops at the undecided copy until the last chunk decides")
    func noPartialFanOut() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let sender = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let devices = try attachDevices(&shards, fan, count: Self.chunk + 10)
        var holds = Holds()
        _ = send(&shards, "m1", to: fan, from: sender, at: 2, holds: &holds)
        holds.runOne(&shards, at: 2)
        let queued = devices.filter { Self.messageIDs($0) == ["m1"] }
        #expect(queued.count == Self.chunk, "the first chunk")
        for device in queued { #expect(Self.writable(shards.states[0], device).isEmpty) }
        // A call event for one of them, queued after the copy, waits behind it too.
        let first = try #require(queued.first)
        shards.states[0].deliverReceipt(DeliveryReceipt(sender: fan, messageID: "x", recipient: bob, shards: shards.states[0].shardMap), recipientDevice: "d", serverTime: 1, into: &effects)
        var written = 0
        _ = shards.states[0].nextBatch(for: first, connection: first.connection!, after: 0, limit: 100) { _, _ in
            written += 1
            return true
        }
        #expect(written == 0, "nothing after the undecided copy goes out before it")
        holds.runAll(&shards, at: 2)
        #expect(TwoShards.isOK(holds.replies.first))
        for device in devices { #expect(Self.writable(shards.states[0], device) == ["m1"]) }
        var types: [FrameType] = []
        _ = shards.states[0].nextBatch(for: first, connection: first.connection!, after: 0, limit: 100) { _, event in
            types.append(event.encoded.type)
            return true
        }
        #expect(types == [.message, .messageDelivered])
    }

    @Test("a fan-out refused by a full queue in its last chunk withdraws every chunk's copies: none is ever written, the room is free, the id too")
    func refusalWithdrawsEveryChunk() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 2 }
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        let devices = try attachDevices(&shards, fan, count: 2 * Self.chunk + 5)
        // The oldest device (the last the walk reaches, newest first) is full.
        let oldest = devices[0]
        for number in 0..<2 {
            let receipt = QueuedEvent(
                .messageDelivered(messageID: "r\(number)", recipient: bob, recipientDevice: "d", serverTime: 1), createdAt: 0)
            let queued = shards.states[0].enqueue(receipt, to: oldest, into: &effects)
            #expect(queued)
        }
        #expect(oldest.queue.count == 2)
        let pendingBefore = shards.states[0].counters.pendingEvents
        var holds = Holds()
        _ = send(&shards, "m1", to: fan, from: laptop, at: 2, holds: &holds)
        holds.runOne(&shards, at: 2)
        holds.runOne(&shards, at: 2)
        #expect(devices.filter { Self.messageIDs($0) == ["m1"] }.count == 2 * Self.chunk, "two chunks queued")
        holds.runOne(&shards, at: 2)  // the last chunk meets the full queue
        #expect(TwoShards.code(holds.replies.first) == nil, "answered only once every copy is withdrawn")
        // Decided: from now on no copy is written, though some are still to be withdrawn.
        for device in devices.dropFirst() { #expect(Self.writable(shards.states[0], device).isEmpty) }
        #expect(Self.writable(shards.states[0], phone).isEmpty)
        holds.runAll(&shards, at: 2)
        #expect(holds.replies.count == 1 && TwoShards.code(holds.replies.first) == .recipientBacklogFull)
        for device in devices.dropFirst() { #expect(device.queue.isEmpty, "withdrawn") }
        // The first two chunks' numbers are holes; the last chunk's devices got none.
        #expect(devices[5...].allSatisfy { $0.lastSeq == 1 } && devices[1..<5].allSatisfy { $0.lastSeq == 0 })
        #expect(phone.queue.isEmpty, "the sender's other device's copy too")
        #expect(shards.states[0].counters.pendingEvents == pendingBefore)
        #expect(shards.states[0].counters.messagesAccepted == 0)
        #expect(shards.states[0].activities[alice]?.recentMessageIDs["m1"] == nil)
        // Room made on the full device: the same id is a new message, and goes everywhere.
        _ = shards.states[0].ack(oldest, connection: oldest.connection!, through: oldest.lastSeq, into: &effects)
        var again = Holds()
        _ = send(&shards, "m1", to: fan, from: laptop, at: 3, holds: &again)
        again.runAll(&shards, at: 3)
        #expect(TwoShards.isOK(again.replies.first))
        for device in devices { #expect(Self.writable(shards.states[0], device) == ["m1"]) }
        #expect(Self.writable(shards.states[0], phone) == ["m1"])
    }

    @Test("messages to a user whose fan-out is in progress wait for it: a second message of the same sender, and one from another shard, come after it on every device")
    func laterMessagesKeepTheirOrder() throws {
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        let bobDevice = try shards.attach(bob, "web", slot: 3, at: 1)
        let devices = try attachDevices(&shards, fan, count: 3 * Self.chunk)
        var first = Holds()
        _ = send(&shards, "m1", to: fan, from: laptop, at: 2, holds: &first)
        first.runOne(&shards, at: 2)
        // Between two chunks of m1: m2 from alice's other device, m3 from bob (the other shard).
        var second = Holds(), third = Holds()
        let secondFirstHold = send(&shards, "m2", to: fan, from: phone, at: 2, holds: &second)
        #expect(secondFirstHold.map { _ in true } ?? false == false, "handed on: it must wait")
        _ = send(&shards, "m3", to: fan, from: bobDevice, at: 2, holds: &third)
        // Their holds alternate with m1's; each of theirs runs a chunk of m1 meanwhile.
        while !(first.pending.isEmpty && second.pending.isEmpty && third.pending.isEmpty) {
            third.runOne(&shards, at: 2)
            second.runOne(&shards, at: 2)
            first.runOne(&shards, at: 2)
        }
        #expect(first.replies.count == 1 && TwoShards.isOK(first.replies.first))
        #expect(second.replies.count == 1 && TwoShards.isOK(second.replies.first))
        #expect(third.replies.count == 1 && TwoShards.isOK(third.replies.first))
        let order = Self.messageIDs(devices[0])
        #expect(order.first == "m1" && Set(order) == ["m1", "m2", "m3"])
        for device in devices { #expect(Self.messageIDs(device) == order, "every device in the same order") }
        #expect(Self.messageIDs(laptop) == ["m2"] && Self.messageIDs(phone) == ["m1"], "the sender's copies")
        #expect(shards.states[0].fanOuts.isEmpty)
    }

    @Test("a fan-out to another shard's user: the recipient's shard runs the chunks, the sender's settles its copies once")
    func acrossShards() throws {
        var shards = TwoShards()
        let web = try shards.attach(bob, "web", slot: 1, at: 1)
        let desk = try shards.attach(bob, "desk", slot: 2, at: 1)
        let devices = try attachDevices(&shards, fan, count: Self.chunk + 1)
        var holds = Holds()
        _ = send(&shards, "m1", to: fan, from: web, at: 2, holds: &holds)
        holds.runOne(&shards, at: 2)
        #expect(Self.writable(shards.states[1], desk).isEmpty, "the sender's copy waits for the decision")
        holds.runAll(&shards, at: 2)
        #expect(holds.replies.count == 1 && TwoShards.isOK(holds.replies.first))
        for device in devices { #expect(Self.writable(shards.states[0], device) == ["m1"]) }
        #expect(Self.writable(shards.states[1], desk) == ["m1"])
        #expect(shards.states[1].activities[bob]?.recentMessageIDs["m1"] != nil, "remembered once decided")
    }

    @Test("a device forgotten while a fan-out is under way is stepped over: the others get the message, the counts stay right")
    func forgottenDeviceDuringFanOut() throws {
        var shards = TwoShards()
        let sender = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let devices = try attachDevices(&shards, fan, count: 2 * Self.chunk)
        var holds = Holds()
        _ = send(&shards, "m1", to: fan, from: sender, at: 2, holds: &holds)
        holds.runOne(&shards, at: 2)
        // The walk goes newest first: devices[chunk - 1] is next, devices[chunk] already has its copy.
        let next = devices[Self.chunk - 1], done = devices[Self.chunk]
        #expect(Self.messageIDs(done) == ["m1"] && Self.messageIDs(next).isEmpty)
        shards.states[0].removeDevice(next)
        shards.states[0].removeDevice(done)
        holds.runAll(&shards, at: 2)
        #expect(TwoShards.isOK(holds.replies.first))
        for device in devices where device !== next && device !== done { #expect(Self.messageIDs(device) == ["m1"]) }
        #expect(Self.messageIDs(next).isEmpty)
        #expect(shards.states[0].counters.pendingEvents == devices.count - 2)
    }
}

extension TwoShards {
    /// A queued event decoded as a device would read it.
    static func decode(_ queued: QueuedEvent) -> Event? {
        var bytes: [UInt8] = []
        FrameEncoder.append(event: queued.encoded, seq: 1, to: &bytes)
        guard let decoded = try? bytes.withUnsafeBytes({ try FrameDecoder().decode($0) }), case .event(_, let event) = decoded.frame
        else { return nil }
        return event
    }
}

@Suite("Fan-out in chunks over real sockets (two loops, two shards)")
struct FanOutEndToEndTests {
    @Test("messages from both shards to a user with more devices than a chunk reach every device once, in the order they were answered, and every receipt comes back")
    func chunkedFanOutOverSockets() throws {
        let server = try TestServer(workers: 2)
        let fan = TwoShards.user("fan", onShard: 0)
        let senders = [TwoShards.user("alice", onShard: 0), TwoShards.user("bob", onShard: 1)]
        let devices = try (0..<(SwitchboardState.fanOutChunk + 20)).map { try server.connect(user: fan, device: "d\($0)").0 }
        let clients = try senders.map { try server.connect(user: $0).0 }
        var sent: [String] = []
        for round in 1...2 {
            for (index, client) in clients.enumerated() {
                let id = "\(senders[index])-\(round)"
                #expect(try client.request(UInt32(round), .messageSend(OutgoingMessage(
                    messageID: id, recipient: fan, contentType: "text/plain", body: Array(id.utf8)))).isOK)
                sent.append(id)
            }
        }
        for device in devices {
            var received: [String] = []
            for _ in sent {
                let (seq, event) = try device.nextEvent()
                guard case .message(let message) = event else { Issue.record("not a message: \(event)"); return }
                received.append(message.messageID)
                try device.ack(seq)
            }
            #expect(received == sent)
        }
        for (index, client) in clients.enumerated() {
            var receipts = 0
            while receipts < 2 * devices.count {
                guard case .messageDelivered(let id, _, _, _) = try client.nextEvent().event else {
                    Issue.record("not a receipt"); return
                }
                #expect(id.hasPrefix(senders[index]))
                receipts += 1
            }
        }
    }
}
