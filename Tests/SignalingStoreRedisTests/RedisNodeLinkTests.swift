import Foundation
import SignalingStore
@testable import SignalingStoreRedis
import SignalingSupport
import TestSupport
import Testing

/// The nodes' channel over Redis pub/sub (`RedisNodeLink`, docs/CLUSTER.md "The node
/// link"), against a real redis-server: delivery and its order, listen names, presence,
/// Redis dying and coming back, and databases kept apart.
@Suite("Redis node link", redisAvailable)
struct RedisNodeLinkTests {
    /// A link started with a recorder, already up (or the test fails).
    /// The default TTL gives a 2 s reply timeout: a loaded test machine never trips it.
    static func upLink(
        _ url: String, nodeID: String? = nil, presenceTTL: Duration = .seconds(8), replyTimeout: Duration? = nil
    ) throws -> (RedisNodeLink, LinkEvents) {
        let link = try RedisNodeLink(
            endpoint: try RedisEndpoint(url: url), nodeID: nodeID, presenceTTL: presenceTTL, replyTimeout: replyTimeout, logger: .silent)
        let events = LinkEvents()
        link.start(events.record)
        guard events.wait(until: { $0.ups >= 1 }) else {
            throw LinkTestFailure("link \(link.nodeID) did not come up: \(events.snapshot.others)")
        }
        return (link, events)
    }

    /// Waits until Redis has `count` subscribers on the channel of `name` (a SUBSCRIBE or
    /// UNSUBSCRIBE the link sent has taken effect).
    static func waitForSubscribers(_ count: Int, to name: String, database: Int = 0, redis: RedisServer) throws -> Bool {
        let connection = try RedisConnection(endpoint: try RedisEndpoint(url: redis.url()), timeoutMilliseconds: 5_000)
        let channel = RedisNodeLink.channel(of: name, database: database)
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        while clock.now() < deadline {
            if case .array(let reply) = try connection.run(RedisCommand("PUBSUB", "NUMSUB", channel)), reply.count == 2,
               case .integer(let subscribers) = reply[1], subscribers == count {
                return true
            }
            clock.sleep(until: clock.now() + .milliseconds(5))
        }
        return false
    }

    @Test("two links exchange 10,000 packets sent from four threads: every packet arrives, each thread's in the order sent")
    func manyPacketsInOrderPerThread() throws {
        let redis = try RedisServer(settings: [])
        let (sender, _) = try Self.upLink(redis.url())
        let (receiver, received) = try Self.upLink(redis.url())
        defer { sender.stop(); receiver.stop() }

        let threads = 4, perThread = 2_500
        let senders = (0..<threads).map { thread in
            JoinableThread {
                for sequence in 0..<perThread {
                    var packet: [UInt8] = [UInt8(thread)]
                    withUnsafeBytes(of: UInt32(sequence).bigEndian) { packet += $0 }
                    sender.send(packet, to: receiver.nodeID)
                }
            }
        }
        for thread in senders { thread.join() }

        #expect(received.wait(within: 60) { $0.packets.count >= threads * perThread })
        var next = [Int](repeating: 0, count: threads)
        for packet in received.snapshot.packets {
            let thread = Int(packet[0])
            let sequence = packet[1...].reduce(0) { $0 << 8 | Int($1) }
            #expect(sequence == next[thread], "thread \(thread): packet \(sequence) arrived when \(next[thread]) was next")
            next[thread] = sequence + 1
        }
        #expect(next == [Int](repeating: perThread, count: threads))
        #expect(sender.statistics().packetsOut == threads * perThread)
        #expect(sender.statistics().bytesPublished == threads * perThread * 5)
        #expect(receiver.statistics().packetsIn == threads * perThread)
        #expect(received.snapshot.others.allSatisfy { $0 == .up }, "no undeliverable, down or gone: \(received.snapshot.others)")
    }

    @Test("a link hears a name it listens as until it stops listening; a packet to a name nobody listens as comes back undeliverable")
    func listenNamesAndUndeliverable() throws {
        let redis = try RedisServer(settings: [])
        let (sender, sent) = try Self.upLink(redis.url())
        let (home, heard) = try Self.upLink(redis.url())
        defer { sender.stop(); home.stop() }

        home.listen(as: "lease-owner-1")
        #expect(try Self.waitForSubscribers(1, to: "lease-owner-1", redis: redis))
        sender.send([1, 2, 3], to: "lease-owner-1")
        #expect(heard.wait { $0.packets == [[1, 2, 3]] })

        home.stopListening(as: "lease-owner-1")
        #expect(try Self.waitForSubscribers(0, to: "lease-owner-1", redis: redis))
        sender.send([4], to: "lease-owner-1")
        #expect(sent.wait { $0.others.contains(.undeliverable(node: "lease-owner-1")) })

        for _ in 0..<5 { sender.send([5], to: "nobody") }
        #expect(sent.wait { $0.others.contains(.undeliverable(node: "nobody")) })
        #expect(sent.wait { _ in sender.statistics().undeliverable == 6 })
        let reports = sent.snapshot.others.filter { $0 == .undeliverable(node: "nobody") }.count
        #expect((1...5).contains(reports), "each lost packet is reported, or coalesced with an earlier report")

        // The listener's own id stays: stopListening(as: nodeID) is ignored.
        home.stopListening(as: home.nodeID)
        sender.send([6], to: home.nodeID)
        #expect(heard.wait { $0.packets.last == [6] })
        #expect(heard.snapshot.packets == [[1, 2, 3], [6]], "nothing sent to a name given up reaches the link")
    }

    @Test("checkListener: no answer while nobody listens as the name, .listening once the listener's SUBSCRIBE is in, and a packet sent after that answer arrives")
    func checkListener() throws {
        let redis = try RedisServer(settings: [])
        let (sender, asked) = try Self.upLink(redis.url())
        let (home, heard) = try Self.upLink(redis.url())
        defer { sender.stop(); home.stop() }

        // Answered in order: the sender's own name (always listened) comes after the question before it.
        sender.checkListener("lease-owner-1")
        sender.checkListener(sender.nodeID)
        #expect(asked.wait { $0.others.contains(.listening(node: sender.nodeID)) })
        #expect(!asked.snapshot.others.contains(.listening(node: "lease-owner-1")), "nobody listens as it yet")

        home.listen(as: "lease-owner-1")
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        while !asked.snapshot.others.contains(.listening(node: "lease-owner-1")), clock.now() < deadline {
            sender.checkListener("lease-owner-1")  // as a front asks at each poll
            clock.sleep(until: clock.now() + .milliseconds(5))
        }
        #expect(asked.snapshot.others.contains(.listening(node: "lease-owner-1")))
        sender.send([1], to: "lease-owner-1")
        #expect(heard.wait { $0.packets == [[1]] })
        #expect(!asked.snapshot.others.contains { $0.kind == "undeliverable" }, "\(asked.snapshot.others)")
        #expect(home.statistics().packetsIn == 1)
    }

    @Test("presence: a link killed without cleanup is gone once its TTL lapses, a cleanly stopped one at once, a live one never")
    func presence() throws {
        let redis = try RedisServer(settings: [])
        let (observer, seen) = try Self.upLink(redis.url())
        // Short TTLs (the test outlasts them), long reply timeouts (a loaded machine never
        // takes a link down). The killed link's key outlives the first check by at least
        // two thirds of its TTL (4 s): a full parallel run once starved the test past 2 s,
        // and its key had lapsed before the check that expects it.
        let (live, _) = try Self.upLink(redis.url(), presenceTTL: .milliseconds(1500), replyTimeout: .seconds(2))
        let (killed, _) = try Self.upLink(redis.url(), presenceTTL: .seconds(6), replyTimeout: .seconds(2))
        let (stopped, _) = try Self.upLink(redis.url())
        defer { observer.stop(); live.stop() }

        /// One presence check, answered in order: the marker (never present) comes last.
        var rounds = 0
        func check(_ nodes: [String]) -> Set<String> {
            rounds += 1
            let marker = "marker-\(rounds)"
            let before = seen.snapshot.others.count
            observer.checkPresence(of: nodes + [marker])
            _ = seen.wait { $0.others.contains(.gone(node: marker)) }
            var gone: Set<String> = []
            for case .gone(let node) in seen.snapshot.others.dropFirst(before) where node != marker { gone.insert(node) }
            return gone
        }

        killed.abandon()
        stopped.stop()
        #expect(check([live.nodeID, killed.nodeID, stopped.nodeID]) == [stopped.nodeID],
                "a clean stop deletes the key; a killed node's key lives until its TTL")
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(20)
        var gone: Set<String> = []
        while !gone.contains(killed.nodeID), clock.now() < deadline {
            gone = check([live.nodeID, killed.nodeID])
            clock.sleep(until: clock.now() + .milliseconds(50))
        }
        #expect(gone == [killed.nodeID], "the killed node is gone; the live one (TTL 1.5 s, refreshed over several TTLs) never is")
    }

    @Test("Redis killed with -9 and restarted on its port: the link says down, then up again, and packets flow again")
    func redisRestart() throws {
        let redis = try RedisServer(settings: [])
        let (sender, sent) = try Self.upLink(redis.url())
        let (receiver, received) = try Self.upLink(redis.url())
        defer { sender.stop(); receiver.stop() }
        sender.send([1], to: receiver.nodeID)
        #expect(received.wait { $0.packets == [[1]] })

        redis.kill()
        #expect(sent.wait { $0.downs == 1 })
        #expect(received.wait { $0.downs == 1 })
        sender.send([2], to: receiver.nodeID)  // while down: dropped, never delivered late
        #expect(sent.wait { _ in sender.statistics().packetsDropped == 1 })

        try redis.start()
        #expect(sent.wait(within: 20) { $0.ups == 2 })
        #expect(received.wait(within: 20) { $0.ups == 2 })
        sender.send([3], to: receiver.nodeID)
        #expect(received.wait { $0.packets.last == [3] })
        #expect(received.snapshot.packets == [[1], [3]])
        #expect(sent.snapshot.others.map(\.kind) == ["up", "down", "up"], "one down per outage, however many attempts failed")
        #expect(sender.statistics().outages == 1)
    }

    @Test("while Redis is away the link tries again with back-off: a handful of connects in 1.5 s, not one per tick")
    func reconnectBacksOff() throws {
        let redis = try RedisServer(settings: [])
        let (link, events) = try Self.upLink(redis.url())
        defer { link.stop() }
        redis.kill()
        #expect(events.wait { $0.downs == 1 })
        let attempts = link.statistics().connectAttempts
        let clock = SystemClock()
        clock.sleep(until: clock.now() + .milliseconds(1_500))  // how long Redis stays away
        // 100 ms doubling, each jittered to 50-100 %: 4 to 5 tries in 1.5 s.
        let tries = link.statistics().connectAttempts - attempts
        #expect((2...7).contains(tries), "\(tries) connects in 1.5 s")
        try redis.start()
        #expect(events.wait(within: 20) { $0.ups == 2 })
    }

    @Test("a Redis that stops answering (SIGSTOP) is noticed within the reply timeout: down, and up once it answers again")
    func redisStopsAnswering() throws {
        let redis = try RedisServer(settings: [])
        let (link, events) = try Self.upLink(redis.url(), presenceTTL: .milliseconds(400))
        defer { link.stop() }
        redis.pause()
        let paused = SystemClock().now()
        #expect(events.wait { $0.downs == 1 })
        let noticed = SystemClock().now() - paused
        redis.resume()
        #expect(events.wait(within: 20) { $0.ups == 2 })
        // The probe or a reply is late after at most a reply timeout (100 ms here) plus a
        // probe interval and a tick; generous for a loaded machine.
        #expect(noticed < .seconds(5), "noticed after \(noticed)")
    }

    @Test("links on two databases of one Redis never hear each other, even under the same name")
    func databasesAreSeparate() throws {
        let redis = try RedisServer(settings: [])
        let (senderOne, sentOne) = try Self.upLink(redis.url("/1"))
        let (homeOne, heardOne) = try Self.upLink(redis.url("/1"))
        let (senderTwo, _) = try Self.upLink(redis.url("/2"))
        let (homeTwo, heardTwo) = try Self.upLink(redis.url("/2"))
        defer { for link in [senderOne, homeOne, senderTwo, homeTwo] { link.stop() } }

        homeOne.listen(as: "home")
        homeTwo.listen(as: "home")
        #expect(try Self.waitForSubscribers(1, to: "home", database: 1, redis: redis))
        #expect(try Self.waitForSubscribers(1, to: "home", database: 2, redis: redis))
        senderOne.send([1], to: "home")
        senderTwo.send([2], to: "home")
        #expect(heardOne.wait { $0.packets == [[1]] })
        #expect(heardTwo.wait { $0.packets == [[2]] })
        senderOne.send([3], to: homeTwo.nodeID)
        #expect(sentOne.wait { $0.others.contains(.undeliverable(node: homeTwo.nodeID)) })
        #expect(heardOne.snapshot.packets == [[1]] && heardTwo.snapshot.packets == [[2]])
    }

    @Test("a subscriber Redis cuts off for reading too slowly says down, comes back up, and hears new packets")
    func slowSubscriberCutOff() throws {
        let redis = try RedisServer(settings: ["--client-output-buffer-limit", "pubsub 64kb 0 0"])
        let (sender, _) = try Self.upLink(redis.url())
        let (receiver, received) = try Self.upLink(redis.url())
        defer { sender.stop(); receiver.stop() }

        let gate = received.holdNextPacket()
        sender.send([0], to: receiver.nodeID)
        #expect(received.wait { $0.packets.count == 1 }, "the receiver's thread is now held in its handler")
        // 32 MB: past what the kernel's socket buffers hold on loopback, then past the 64 KB
        // Redis keeps for a subscriber.
        let chunk = [UInt8](repeating: 7, count: 64 * 1024)
        for _ in 0..<512 { sender.send(chunk, to: receiver.nodeID) }
        #expect(try Self.waitForSubscribers(0, to: receiver.nodeID, redis: redis), "Redis cut the subscriber off")
        gate.signal()
        #expect(received.wait(within: 20) { $0.downs == 1 && $0.ups == 2 })
        sender.send([9], to: receiver.nodeID)
        #expect(received.wait { $0.packets.last == [9] })
    }

    @Test("on a Redis with a password both connections authenticate; with a wrong one the link never comes up and keeps trying")
    func password() throws {
        let redis = try RedisServer(settings: ["--requirepass", "s3cret"])
        let (sender, _) = try Self.upLink("redis://:s3cret@127.0.0.1:\(redis.port)/4")
        let (receiver, received) = try Self.upLink("redis://:s3cret@127.0.0.1:\(redis.port)/4")
        defer { sender.stop(); receiver.stop() }
        sender.send([1], to: receiver.nodeID)
        #expect(received.wait { $0.packets == [[1]] })

        let refused = try RedisNodeLink(
            endpoint: try RedisEndpoint(url: "redis://:wrong@127.0.0.1:\(redis.port)/4"), presenceTTL: .seconds(8), logger: .silent)
        let events = LinkEvents()
        refused.start(events.record)
        defer { refused.stop() }
        #expect(events.wait { _ in refused.statistics().connectAttempts >= 2 }, "refused, then tried again after the back-off")
        #expect(events.snapshot.total == 0, "never up, so never down either: \(events.snapshot.others)")
    }

    @Test("a new database that holds only the nodes' presence keys and the lease counts as empty: the store makes it its own")
    func presenceKeysDoNotMakeADatabaseForeign() throws {
        let redis = try RedisServer()
        let endpoint = try RedisEndpoint(url: redis.url("/3"))
        let (link, _) = try Self.upLink(redis.url("/3"))
        defer { link.stop() }
        let lease = RedisLease(endpoint: endpoint, ttl: .seconds(30))
        #expect(try lease.acquire())
        let connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: 5_000)
        #expect(try connection.run(RedisCommand("EXISTS", RedisNodeLink.presenceKey(of: link.nodeID))) == .integer(1))
        _ = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: endpoint, fencingToken: lease.ownerID))
        #expect(try connection.run(RedisCommand("GET", RedisLayout.schemaKey)) == .string(Array("1".utf8)))
    }

    @Test("after stop returns, no event reaches the handler, and sending to the stopped link is undeliverable")
    func noEventAfterStop() throws {
        let redis = try RedisServer(settings: [])
        let (sender, sent) = try Self.upLink(redis.url())
        let (receiver, received) = try Self.upLink(redis.url())
        defer { sender.stop() }
        receiver.stop()
        let count = received.snapshot.total
        // Redis drops the subscription when it reads the closed socket, maybe after a
        // PUBLISH that was already on its way.
        #expect(try Self.waitForSubscribers(0, to: receiver.nodeID, redis: redis))
        sender.send([1], to: receiver.nodeID)
        #expect(sent.wait { $0.others.contains(.undeliverable(node: receiver.nodeID)) }, "\(sent.snapshot.others)")
        receiver.send([2], to: sender.nodeID)  // a stopped link drops what it is given
        receiver.stop()  // twice: harmless
        #expect(received.snapshot.total == count)
    }
}

struct LinkTestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension NodeLinkEvent {
    /// The case's name, for comparing sequences of events.
    var kind: String {
        switch self {
        case .packet: return "packet"
        case .up: return "up"
        case .down: return "down"
        case .undeliverable: return "undeliverable"
        case .gone: return "gone"
        case .listening: return "listening"
        }
    }
}

/// A link's events as its handler got them, and waits on them with a deadline.
final class LinkEvents: @unchecked Sendable {
    struct Snapshot {
        var packets: [[UInt8]] = []
        /// Every event but packets, in order.
        var others: [NodeLinkEvent] = []
        var ups: Int { others.filter { $0 == .up }.count }
        var downs: Int { others.filter { $0.kind == "down" }.count }
        var total: Int { packets.count + others.count }
    }

    private let condition = NSCondition()
    private var events = Snapshot()
    private var gate: DispatchSemaphore?

    var record: @Sendable (NodeLinkEvent) -> Void { { [self] event in self.append(event) } }

    private func append(_ event: NodeLinkEvent) {
        condition.lock()
        if case .packet(let bytes) = event { events.packets.append(bytes) } else { events.others.append(event) }
        var held: DispatchSemaphore?
        if case .packet = event, let gate {
            held = gate
            self.gate = nil
        }
        condition.broadcast()
        condition.unlock()
        held?.wait()  // a handler that is slow: the link's thread reads nothing meanwhile
    }

    /// The next packet's handler call blocks until the returned semaphore is signalled.
    func holdNextPacket() -> DispatchSemaphore {
        let semaphore = DispatchSemaphore(value: 0)
        condition.lock()
        gate = semaphore
        condition.unlock()
        return semaphore
    }

    var snapshot: Snapshot {
        condition.lock()
        defer { condition.unlock() }
        return events
    }

    /// Waits until `predicate` holds for the events so far; false at the deadline.
    func wait(within seconds: TimeInterval = 10, until predicate: (Snapshot) -> Bool) -> Bool {
        let deadline = Date(timeIntervalSinceNow: seconds)
        condition.lock()
        defer { condition.unlock() }
        while !predicate(events) {
            // Predicates may also look at the link's statistics, which change without an event.
            let wake = min(deadline, Date(timeIntervalSinceNow: 0.01))
            if !condition.wait(until: wake), Date() >= deadline { return predicate(events) }
        }
        return true
    }
}
