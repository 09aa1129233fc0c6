import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// What the store promises when Redis crashes, stops answering or comes back different.
@Suite("Redis store: crashes, outages and Redis's settings", redisAvailable)
struct RedisDurabilityTests {
    @Test("kill -9 of redis-server (appendfsync always): every acknowledged batch is there after its restart")
    func killNineAfterAcknowledgedBatches() throws {
        let harness = try RedisStoreHarness()
        for number in 0..<60 { try harness.apply(CrashWorkload.batch(number)) }
        harness.redis.kill()
        #expect(throws: StoreError.self) { try harness.store.apply(CrashWorkload.batch(60)) }
        try harness.redis.start()
        try harness.reopen()
        try harness.verify()
    }

    @Test("kill -9 of redis-server while batches are applied: it holds the acknowledged ones and at most the one in flight")
    func killNineMidStream() throws {
        let harness = try RedisStoreHarness()
        final class Progress: Sendable {
            /// The last batch `apply` returned for.
            let acknowledged = Atomic<Int>(-1)
        }
        let progress = Progress()
        let writer = JoinableThread(name: "batches") { [store = harness.store] in
            var number = 0
            while (try? store.apply(CrashWorkload.batch(number))) != nil {
                progress.acknowledged.store(number, ordering: .releasing)
                number += 1
            }
        }
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(30)
        while progress.acknowledged.load(ordering: .acquiring) < 100 && clock.now() < deadline { clock.sleep(until: clock.now() + .milliseconds(1)) }
        harness.redis.kill()
        writer.join()
        let last = progress.acknowledged.load(ordering: .acquiring)
        try #require(last >= 100, "only \(last + 1) batches were applied in 30 s")

        try harness.redis.start()
        try harness.reopen()
        let snapshot = try harness.store.loadSnapshot()
        var model = ReferenceStore()
        for number in 0...last { model.apply(CrashWorkload.batch(number)) }
        if snapshot != model.snapshot { model.apply(CrashWorkload.batch(last + 1)) }
        #expect(snapshot == model.snapshot, "the store matches neither batch \(last) nor \(last + 1)")
    }

    @Test("Redis down: apply fails with io at once, within the back-off without connecting; back up, the next apply reconnects")
    func reconnectsAfterOutage() throws {
        let harness = try RedisStoreHarness { $0.firstReconnectDelayMilliseconds = 200 }
        try harness.apply([Sample.device("alice", "phone")])
        harness.redis.kill()
        let batch = [Sample.append("alice", "phone", 1)]
        #expect(harness.applyFailing(batch)?.kind == .io)  // the connection breaks
        #expect(harness.applyFailing(batch)?.kind == .io)  // the connect is refused
        let backingOff = harness.applyFailing(batch)
        #expect(backingOff?.kind == .io)
        #expect(backingOff?.message.contains("next attempt in") == true, "\(String(describing: backingOff))")

        try harness.redis.start()
        #expect(harness.applyOnceReachable(batch))
        harness.model(batch)
        try harness.verify()
    }

    @Test("a Redis that stops answering fails the batch after the timeout instead of hanging")
    func hungRedis() throws {
        let harness = try RedisStoreHarness { $0.timeoutMilliseconds = 300 }
        try harness.apply([Sample.device("alice", "phone")])
        harness.redis.pause()
        defer { harness.redis.resume() }
        let clock = SystemClock()
        let started = clock.now()
        #expect(harness.applyFailing([Sample.append("alice", "phone", 1)])?.kind == .io)
        #expect(clock.now() - started < .seconds(3))
    }

    @Test("Redis restarted without its data: the store refuses to go on rather than write into an empty database")
    func lostData() throws {
        let harness = try RedisStoreHarness(settings: ["--appendonly", "no", "--save", ""]) { $0.allowVolatile = true }
        try harness.apply([Sample.device("alice", "phone")])
        harness.redis.kill()
        try harness.redis.start()
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        var error: StoreError?
        while clock.now() < deadline {
            do {
                try harness.store.apply([Sample.append("alice", "phone", 1)])
                Issue.record("applied into an empty Redis")
                return
            } catch let failure {
                error = failure
                if failure.kind == .corrupt { break }
                clock.sleep(until: clock.now() + .milliseconds(50))
            }
        }
        #expect(error?.kind == .corrupt)
        #expect(error?.message.contains("lost the store") == true, "\(String(describing: error))")
    }

    @Test("the AOF must be on and as strong as required, unless volatile is allowed",
          arguments: [
            (["--appendonly", "no"], RedisStoreConfiguration.Fsync.everysec, false, "appendonly no"),
            (["--appendonly", "yes", "--appendfsync", "everysec"], .always, false, "appendfsync everysec"),
            (["--appendonly", "yes", "--appendfsync", "no"], .everysec, false, "appendfsync no"),
            (["--appendonly", "yes", "--appendfsync", "everysec"], .everysec, true, ""),
            (["--appendonly", "yes", "--appendfsync", "always"], .always, true, ""),
          ])
    func durabilityRequirement(settings: [String], required: RedisStoreConfiguration.Fsync, opens: Bool, named: String) throws {
        let redis = try RedisServer(settings: settings + ["--save", ""])
        var configuration = RedisStoreConfiguration(endpoint: try RedisEndpoint(url: redis.url()), requiredFsync: required)
        if opens {
            _ = try RedisEventStore(configuration: configuration)
            return
        }
        let error = #expect(throws: StoreError.self) { _ = try RedisEventStore(configuration: configuration) }
        #expect(error?.message.contains(named) == true && error?.message.contains("--redis-allow-volatile") == true,
                "\(String(describing: error))")
        configuration.allowVolatile = true
        _ = try RedisEventStore(configuration: configuration)
    }

    @Test("a database with other keys, or of a newer layout, is refused; an empty one is made ours")
    func schemaVersion() throws {
        let redis = try RedisServer()
        let other = try RedisEndpoint(url: redis.url("/1"))
        let connection = try RedisConnection(endpoint: other, timeoutMilliseconds: 5_000)
        #expect(try connection.run(RedisCommand("SET", "someone-else", "x")) == .status("OK"))
        let foreign = #expect(throws: StoreError.self) { _ = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: other)) }
        #expect(foreign?.kind == .corrupt && foreign?.message.contains("not a voipserver store") == true, "\(String(describing: foreign))")

        let mine = try RedisEndpoint(url: redis.url("/2"))
        _ = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: mine))
        let check = try RedisConnection(endpoint: mine, timeoutMilliseconds: 5_000)
        #expect(try check.run(RedisCommand("GET", RedisLayout.schemaKey)) == .string(Array("1".utf8)))
        #expect(try check.run(RedisCommand("SET", RedisLayout.schemaKey, "99")) == .status("OK"))
        let newer = #expect(throws: StoreError.self) { _ = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: mine)) }
        #expect(newer?.kind == .corrupt && newer?.message.contains("newer voipserver") == true, "\(String(describing: newer))")
    }

    @Test("the URL: password, user, database, IPv6, defaults; bad ones are refused without echoing the password")
    func urls() throws {
        #expect(try RedisEndpoint(url: "redis://example.net") == RedisEndpoint(host: "example.net"))
        #expect(try RedisEndpoint(url: "redis://:s%40cret@10.0.0.1:6380/3")
            == RedisEndpoint(host: "10.0.0.1", port: 6380, password: "s@cret", database: 3))
        #expect(try RedisEndpoint(url: "redis://app:pw@[::1]:7000/")
            == RedisEndpoint(host: "::1", port: 7000, username: "app", password: "pw"))
        #expect(RedisEndpoint(host: "::1", port: 7000, password: "pw").redacted == "redis://:***@[::1]:7000/0")
        for bad in ["http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/x", "redis://secretonly@h", "redis://:p%zz@h"] {
            let error = #expect(throws: StoreError.self) { _ = try RedisEndpoint(url: bad) }
            #expect(error?.message.contains("not a Redis URL") == true, "\(bad)")
        }
        let error = #expect(throws: StoreError.self) { _ = try RedisEndpoint(url: "redis://:hunter2@h:notaport") }
        #expect(error?.message.contains("hunter2") == false)
    }
}
