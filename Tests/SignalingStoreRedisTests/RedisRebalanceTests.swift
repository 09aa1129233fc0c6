import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import SignalingSupport
import TestSupport
import Testing

/// `voipserver store-rebalance` (`RedisRebalance`, docs/STORAGE.md "Adding an instance"):
/// users moved onto a new list of instances, whole, once, with the store refused by nodes
/// while it moves and fenced against any node still writing.
@Suite("Redis store: rebalancing users over a new list of instances", redisAvailable)
struct RedisRebalanceTests {
    /// Devices, queued events, push registrations, held events and message ids of
    /// `count` users, plus ids that need escaping in keys and the edge values.
    private func fill(_ harness: RedisStoreHarness, users count: Int) throws {
        var changes: [StoreChange] = Sample.edgeValues
        for user in (0..<count).map({ "user-\($0)" }) + ["a}b%c", "%7D"] {
            changes += [Sample.device(user, "phone"), Sample.append(user, "phone", 1), Sample.append(user, "phone", 2),
                        .registerPush(user: user, device: "phone", registration: PushRegistration(platform: "fcm", token: Array(user.utf8)))]
            changes.append(.rememberMessageID(StoredMessageID(sender: user, messageID: "m-\(user)", serverTime: 1, expiresAt: .max)))
        }
        changes.append(.holdForUser(user: "offline-only", event: Sample.event(1)))
        try harness.apply(changes)
    }

    private func options(_ from: [RedisServer], _ to: [RedisServer]) throws -> RedisRebalance.Options {
        RedisRebalance.Options(from: try from.map { try RedisEndpoint(url: $0.url()) }, to: try to.map { try RedisEndpoint(url: $0.url()) })
    }

    private func store(on servers: [RedisServer], token: String? = nil) throws(StoreError) -> RedisEventStore {
        var endpoints: [RedisEndpoint] = []
        for server in servers { endpoints.append(try RedisEndpoint(url: server.url())) }
        return try RedisEventStore(configuration: RedisStoreConfiguration(endpoints: endpoints, fencingToken: token))
    }

    @Test("a key is read back to its user, with } and % in the id; keys that are not a user's have none")
    func userOfKey() {
        for user in ["alice", "a}b%c", "%7D", "", "zoë 👋", "x}:y"] {
            #expect(RedisLayout.user(ofKey: RedisLayout.devicesKey(user)) == user)
            #expect(RedisLayout.user(ofKey: RedisLayout.queueKey(user, "d}:q")) == user)
        }
        #expect(RedisLayout.user(ofKey: Array(RedisLayout.usersKey.utf8)) == nil)
        #expect(RedisLayout.user(ofKey: Array("{u:unterminated".utf8)) == nil)
    }

    @Test("an instance added at the end: only the users it now holds move, and the store opens on the new list with all it held")
    func addingAnInstance() throws {
        let harness = try RedisStoreHarness(instances: 2)
        try fill(harness, users: 60)
        harness.store.close()
        let added = try RedisServer()
        let users = try harness.indexedUsers()
        let expectedMoves = users.filter { RedisShards.instance(ofUser: $0, count: 3) == 2 }.count
        #expect(expectedMoves > 0)

        var dry = try options(harness.servers, harness.servers + [added])
        dry.dryRun = true
        let preview = try RedisRebalance.run(dry)
        #expect(preview.usersMoved == expectedMoves)
        #expect(try store(on: harness.servers).loadSnapshot() == harness.reference.snapshot, "a dry run changes nothing")

        let report = try RedisRebalance.run(try options(harness.servers, harness.servers + [added]))
        #expect(report.usersMoved == expectedMoves)
        #expect(report.usersInPlace == users.count - expectedMoves)
        #expect(report.usersPerInstance.reduce(0, +) == users.count)
        #expect(report.usersPerInstance[2] == expectedMoves, "the new instance holds exactly the moved users")
        #expect(!report.resumed)

        let grown = try store(on: harness.servers + [added])
        #expect(try grown.loadSnapshot() == harness.reference.snapshot, "every device, event, push registration, held event and id")
        grown.close()
        #expect(throws: StoreError.self, "the old list no longer matches") { try store(on: harness.servers).close() }

        let again = try RedisRebalance.run(try options(harness.servers, harness.servers + [added]))
        #expect(again.usersMoved == 0, "a second run finds everyone in place")
    }

    @Test("an interrupted move: nodes refuse the store, pointing at store-rebalance; running it again finishes it, nothing lost")
    func interruptedMove() throws {
        let harness = try RedisStoreHarness(instances: 1)
        try fill(harness, users: 40)
        harness.store.close()
        let added = try RedisServer()
        var interrupted = RedisRebalance(options: try options(harness.servers, harness.servers + [added]), logger: .silent, stopAfterMoves: 5)
        #expect(throws: StoreError.self) { try interrupted.run() }

        for list in [harness.servers, harness.servers + [added]] {
            #expect {
                try store(on: list).close()
            } throws: { error in
                "\(error)".contains("store-rebalance")
            }
        }
        var other = try options(harness.servers, [added] + harness.servers)
        other.force = true
        #expect(throws: StoreError.self, "a move of other lists cannot start over an interrupted one") { try RedisRebalance.run(other) }

        let report = try RedisRebalance.run(try options(harness.servers, harness.servers + [added]))
        #expect(report.resumed)
        #expect(report.usersMoved > 0)
        let grown = try store(on: harness.servers + [added])
        #expect(try grown.loadSnapshot() == harness.reference.snapshot)
        grown.close()
    }

    @Test("a node holding the lease stops the move; forced, the move fences that node, whose later batches are refused everywhere")
    func liveNodeAndFencing() throws {
        let harness = try RedisStoreHarness(instances: 2)
        try fill(harness, users: 20)
        harness.store.close()
        _ = try harness.connection().run(RedisCommand("SET", RedisLayout.leaseKey, "node-1"))
        let node = try store(on: harness.servers, token: "node-1")
        let added = try RedisServer()

        #expect {
            try RedisRebalance.run(try options(harness.servers, harness.servers + [added]))
        } throws: { error in
            "\(error)".contains("node-1")
        }
        var forced = try options(harness.servers, harness.servers + [added])
        forced.force = true
        _ = try RedisRebalance.run(forced)

        // Users on each old instance: the node's batch for either is refused.
        let users = (0..<20).map { "user-\($0)" }
        for instance in 0..<2 {
            let user = try #require(users.first { RedisShards.instance(ofUser: $0, count: 2) == instance })
            #expect {
                try node.apply([Sample.append(user, "phone", 3)])
            } throws: { error in
                "\(error)".contains("VSFENCED")
            }
        }
        node.close()
        let grown = try store(on: harness.servers + [added])
        #expect(try grown.loadSnapshot() == harness.reference.snapshot, "the refused batches left nothing behind")
        grown.close()
    }

    @Test("refused before anything moves: a running cluster node, a new instance holding other data, a --from in the wrong order")
    func refusals() throws {
        let harness = try RedisStoreHarness(instances: 2)
        try fill(harness, users: 10)
        harness.store.close()
        let added = try RedisServer()
        let first = try harness.connection()

        _ = try first.run(RedisCommand("SET", RedisNodeLink.presenceKey(of: "front-7"), "x", "PX", "60000"))
        #expect(throws: StoreError.self) { try RedisRebalance.run(try options(harness.servers, harness.servers + [added])) }
        _ = try first.run(RedisCommand("DEL", RedisNodeLink.presenceKey(of: "front-7")))

        _ = try RedisConnection(endpoint: try RedisEndpoint(url: added.url()), timeoutMilliseconds: 5_000).run(RedisCommand("SET", "foreign", "1"))
        #expect {
            try RedisRebalance.run(try options(harness.servers, harness.servers + [added]))
        } throws: { error in
            "\(error)".contains("foreign")
        }
        let fresh = try RedisServer()
        #expect(throws: StoreError.self) { try RedisRebalance.run(try options(harness.servers.reversed(), harness.servers + [fresh])) }
        #expect(try store(on: harness.servers).loadSnapshot() == harness.reference.snapshot, "nothing was changed")
    }

    @Test("voipserver store-rebalance: usage errors exit 64, a move exits 0 and says what it moved, a refusal exits 70")
    func command() throws {
        #expect(StoreRebalanceCommand.run(["--help"]).output.contains("--from"))
        #expect(StoreRebalanceCommand.run(["--to", "redis://127.0.0.1:1"]).status == 64)
        #expect(StoreRebalanceCommand.run(["--from", "http://x", "--to", "redis://127.0.0.1:1"]).status == 64)

        let harness = try RedisStoreHarness(instances: 1)
        try fill(harness, users: 10)
        harness.store.close()
        let added = try RedisServer()
        let arguments = ["--from", harness.redis.url(), "--to", "\(harness.redis.url()),\(added.url())"]
        let run = try ExecutableRun.run("voipserver", ["store-rebalance"] + arguments, timeoutSeconds: 60)
        #expect(run.exitCode == 0, "\(run.stderr)")
        #expect(run.stdout.contains("moved "), "\(run.stdout)")
        #expect(try store(on: [harness.redis, added]).loadSnapshot() == harness.reference.snapshot)

        _ = try harness.connection().run(RedisCommand("SET", RedisLayout.leaseKey, "node-9"))
        let refused = StoreRebalanceCommand.run(["--from", "\(harness.redis.url()),\(added.url())", "--to", harness.redis.url()])
        #expect(refused.status == 70)
        #expect(refused.error.contains("node-9"))
    }
}
