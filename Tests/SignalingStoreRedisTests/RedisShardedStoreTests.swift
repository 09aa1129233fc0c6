import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingSupport
@testable import SignalingStoreRedis
import TestSupport
import Testing

/// The store spread over three Redis instances (docs/STORAGE.md, "Several Redis instances"):
/// where users land, a batch per instance, failures of one instance, the list checked,
/// fencing across instances. The conformance tests run on three instances too
/// (`instanceCounts`).
@Suite("Redis store over several instances", redisAvailable)
struct RedisShardedStoreTests {
    /// Two users the hash places on different instances of `count`.
    private func usersOnDifferentInstances(count: Int = 3) -> (String, String) {
        let users = (0..<100).map { "user-\($0)" }
        let first = users[0]
        let second = users.first { RedisShards.instance(ofUser: $0, count: count) != RedisShards.instance(ofUser: first, count: count) }!
        return (first, second)
    }

    private func exists(_ key: [UInt8], on connection: RedisConnection) throws -> Bool {
        var command = RedisCommand("EXISTS")
        command.append(key)
        return try connection.run(command) == .integer(1)
    }

    @Test("a comma list of URLs: the instances in order; the same database twice, or a bad URL, is refused without echoing a password")
    func endpointList() throws {
        #expect(try RedisEndpoint.list("redis://a:1,redis://b:2/3, redis://:p%2Cw@c") == [
            RedisEndpoint(host: "a", port: 1), RedisEndpoint(host: "b", port: 2, database: 3),
            RedisEndpoint(host: "c", password: "p,w"),
        ])
        #expect(throws: StoreError.self) { try RedisEndpoint.list("redis://a:1,redis://a:1/0") }
        #expect(try RedisEndpoint.list("redis://a:1,redis://a:1/1").count == 2, "two databases of one Redis are two instances")
        #expect {
            try RedisEndpoint.list("redis://:secret@a,b:1")
        } throws: { error in
            !"\(error)".contains("secret")
        }
    }

    @Test("users spread over the instances: each holds some users, and all of a user's keys sit on one instance")
    func usersSpread() throws {
        let harness = try RedisStoreHarness(instances: 3)
        let users = (0..<30).map { "user-\($0)" }
        try harness.apply(users.flatMap { [Sample.device($0, "phone"), Sample.append($0, "phone", 1)] })
        var holders: [String: [Int]] = [:]
        for instance in 0..<3 {
            let connection = try harness.connection(instance: instance)
            guard case .array(let members) = try connection.run(RedisCommand("SMEMBERS", RedisLayout.usersKey)) else {
                Issue.record("no user index on instance \(instance)")
                continue
            }
            #expect(members.count >= 3, "instance \(instance) holds \(members.count) of 30 users")
            for user in users {
                let devices = try exists(RedisLayout.devicesKey(user), on: connection)
                let queue = try exists(RedisLayout.queueKey(user, "phone"), on: connection)
                #expect(devices == queue, "\(user)'s keys are together")
                if devices { holders[user, default: []].append(instance) }
            }
        }
        for user in users {
            #expect(holders[user] == [RedisShards.instance(ofUser: user, count: 3)], "\(user) on exactly its instance")
        }
        try harness.verify()
    }

    @Test("the placement is stable: fixed user ids land on fixed instances (a change would strand stored users)")
    func placementIsStable() {
        #expect(StableHash.fnv1a("") == 0xcbf2_9ce4_8422_2325)
        #expect(StableHash.fnv1a("a") == 0xaf63_dc4c_8601_ec8c)  // FNV-1a 64's published value
        #expect((0..<8).map { RedisShards.jumpHash(UInt64($0), buckets: 1) } == Array(repeating: 0, count: 8))
        #expect(RedisShards.jumpHash(0xcbf2_9ce4_8422_2325, buckets: 3) == RedisShards.instance(ofUser: "", count: 3))
        // Growing the list moves users only to the new instance.
        for user in (0..<500).map({ "u\($0)" }) {
            let before = RedisShards.instance(ofUser: user, count: 3), after = RedisShards.instance(ofUser: user, count: 4)
            #expect(after == before || after == 3, "\(user): \(before) -> \(after)")
        }
    }

    @Test("a batch's message ids run after every other part: one round for one instance, two when it spans instances")
    func messageIDsLast() {
        let (alice, bob) = usersOnDifferentInstances()
        let id = StoredMessageID(sender: alice, messageID: "m1", serverTime: 1, expiresAt: 2)
        let spanning: [StoreChange] = [.rememberMessageID(id), Sample.append(bob, "phone", 1), Sample.append(alice, "phone", 1)]
        let rounds = RedisEventStore.split(spanning, instances: 3)
        #expect(rounds.count == 2)
        #expect(rounds[0].flatMap(\.changes).count == 2)
        #expect(rounds[1].map(\.changes) == [[.rememberMessageID(id)]])
        #expect(rounds[1][0].instance == RedisShards.instance(ofUser: alice, count: 3))
        let alone: [StoreChange] = [.rememberMessageID(id), Sample.append(alice, "phone", 1)]
        #expect(RedisEventStore.split(alone, instances: 3).map { $0.map(\.changes) } == [[alone]], "one instance: one atomic script, in order")
    }

    @Test("a message between users on different instances is stored on both, and survives reopening the store")
    func messageAcrossInstances() throws {
        let harness = try RedisStoreHarness(instances: 3)
        let (sender, recipient) = usersOnDifferentInstances()
        try harness.apply([Sample.device(sender, "phone"), Sample.device(recipient, "phone")])
        let receipt = StoredReceipt(sender: sender, messageID: "m-1", recipient: recipient)
        try harness.apply([
            .appendEvent(user: recipient, device: "phone", event: Sample.event(1, receipt: receipt)),
            .rememberMessageID(StoredMessageID(sender: sender, messageID: "m-1", serverTime: 5, expiresAt: 50)),
        ])
        #expect(try exists(RedisLayout.queueKey(recipient, "phone"), on: harness.connection(forUser: recipient)))
        #expect(try exists(RedisLayout.messageIDsKey(sender), on: harness.connection(forUser: sender)))
        #expect(try !exists(RedisLayout.messageIDsKey(sender), on: harness.connection(forUser: recipient)))
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.devices.first { $0.userID == recipient }?.events.first?.receipt == receipt)
        #expect(snapshot.messageIDs.map(\.messageID) == ["m-1"])
    }

    @Test("one instance killed: batches touching it fail with io and store no message id; restarted, the retry applies everything")
    func instanceDown() throws {
        let harness = try RedisStoreHarness(instances: 3) { $0.firstReconnectDelayMilliseconds = 50 }
        let (sender, recipient) = usersOnDifferentInstances()
        try harness.apply([Sample.device(sender, "phone"), Sample.device(recipient, "phone")])
        let recipientInstance = RedisShards.instance(ofUser: recipient, count: 3)
        harness.servers[recipientInstance].kill()

        let batch: [StoreChange] = [
            Sample.append(recipient, "phone", 1), Sample.append(sender, "phone", 1),
            .rememberMessageID(StoredMessageID(sender: sender, messageID: "m-1", serverTime: 5, expiresAt: 50)),
        ]
        #expect(harness.applyFailing(batch)?.kind == .io)
        // The sender's id was not stored: a resend is not taken for a duplicate of a message
        // whose event the recipient's instance never got. The sender's own event was (its
        // part ran in the first round): applied again by the retry, harmlessly.
        #expect(try !exists(RedisLayout.messageIDsKey(sender), on: harness.connection(forUser: sender)))
        #expect(try exists(RedisLayout.queueKey(sender, "phone"), on: harness.connection(forUser: sender)))
        // Batches that touch only the other instances go through meanwhile.
        let elsewhere = [Sample.append(sender, "phone", 2)]
        try harness.apply(elsewhere)

        try harness.servers[recipientInstance].start()
        #expect(harness.applyOnceReachable(batch))
        harness.model(batch)
        try harness.reopen()
        try harness.verify()
    }

    @Test("a list of instances reordered or grown is refused at open, before anything is read or written")
    func listMustMatch() throws {
        let harness = try RedisStoreHarness(instances: 3)
        try harness.apply((0..<10).map { Sample.device("user-\($0)", "phone") })
        harness.store.close()
        var reordered = harness.configuration
        reordered.endpoints.swapAt(0, 2)
        #expect {
            try RedisEventStore(configuration: reordered)
        } throws: { error in
            (error as? StoreError)?.message.contains("Adding an instance") == true
        }
        var grown = harness.configuration
        let fourth = try RedisServer()
        grown.endpoints.append(try RedisEndpoint(url: fourth.url()))
        #expect(throws: StoreError.self) { try RedisEventStore(configuration: grown) }
        // The right list still opens, and everything is there.
        try harness.reopen()
        try harness.verify()
    }

    @Test("fencing across instances: a deposed holder's late batch is refused on every instance the new holder fenced")
    func fencingAcrossInstances() throws {
        let servers = try (0..<3).map { _ in try RedisServer() }
        let endpoints = try servers.map { try RedisEndpoint(url: $0.url()) }
        let first = RedisLease(endpoint: endpoints[0], ttl: .seconds(30), ownerIDs: { "node-a" })
        #expect(try first.acquire())
        let old = try RedisEventStore(configuration: RedisStoreConfiguration(endpoints: endpoints, fencingToken: "node-a"))
        // Users on each instance, so every instance's fence is exercised.
        let users = (0..<40).map { "user-\($0)" }
        let byInstance = Dictionary(grouping: users) { RedisShards.instance(ofUser: $0, count: 3) }
        #expect(byInstance.keys.sorted() == [0, 1, 2])
        try old.apply(users.map { Sample.device($0, "phone") })

        // node-a stalls past its lease; node-b takes it and opens its store (which fences).
        _ = try RedisConnection(endpoint: endpoints[0], timeoutMilliseconds: 5_000).run(RedisCommand("DEL", RedisLayout.leaseKey))
        let second = RedisLease(endpoint: endpoints[0], ttl: .seconds(30), ownerIDs: { "node-b" })
        #expect(try second.acquire())
        let successor = try RedisEventStore(configuration: RedisStoreConfiguration(endpoints: endpoints, fencingToken: "node-b"))

        // node-a's late batches, one per instance: each refused, none of it written.
        for instance in 0..<3 {
            let user = byInstance[instance]![0]
            var refusal: StoreError?
            do { try old.apply([Sample.append(user, "phone", 1)]) } catch { refusal = error }
            #expect(refusal?.message.contains("VSFENCED") == true, "instance \(instance): \(String(describing: refusal))")
        }
        #expect(try successor.loadSnapshot().devices.allSatisfy { $0.events.isEmpty })
        try successor.apply(users.map { Sample.append($0, "phone", 1) })

        // A holder that stalled between taking the lease and fencing cannot fence over a
        // later term, and so cannot open its store at all.
        let stale = try RedisConnection(endpoint: endpoints[1], timeoutMilliseconds: 5_000)
        #expect(throws: StoreError.self) { try RedisFence.fence(stale, token: "node-a", term: 1) }
        #expect(try stale.run(RedisCommand("GET", RedisLayout.fenceKey)) == .string(Array("node-b".utf8)))
        #expect(throws: StoreError.self) {
            try RedisEventStore(configuration: RedisStoreConfiguration(endpoints: endpoints, fencingToken: "node-a"))
        }
        #expect(try successor.loadSnapshot().devices.allSatisfy { $0.events.map(\.seq) == [1] })
    }
}
