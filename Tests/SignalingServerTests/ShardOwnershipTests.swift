import SignalingProtocol
import SignalingStore
@testable import SignalingServer
import SignalingSupport
import Synchronization
import Testing
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A running loop owns its routing shard and touches it with no lock; other threads hand
/// their holds to it, and take the shard's fallback lock only while no loop runs it
/// (Switchboard.swift's top comment; docs/ARCHITECTURE.md, "Routing shards").
@Suite("Routing shards owned by their running loops: no lock; other threads hand work to the owner")
struct ShardOwnershipTests {
    /// A user id starting with `prefix` that shard `shard` of 2 holds.
    func user(_ prefix: String, onShard shard: Int) -> String {
        (0...).lazy.map { "\(prefix)\($0)" }.first { ShardMap.shard(of: $0, count: 2) == shard }!
    }

    func http(_ server: TestServer, _ method: String, _ path: String, json: String? = nil) throws -> HTTPReply {
        try HTTPRequest.send(
            method, port: server.server.adminPort!, path, body: json.map { Array($0.utf8) },
            headers: json == nil ? [:] : ["Content-Type": "application/json"])
    }

    @Test("a hold of a shard by a thread that is no loop runs on the shard's owner loop while it runs")
    func heldOnTheOwner() throws {
        let server = try TestServer(workers: 2)
        // A loop claims its shard as its thread starts running, before its first tick.
        #expect(server.server.awaitTicks(1))
        let switchboard = server.server.switchboard
        let handOffsBefore = server.server.routingShardHandOffs
        for shard in 0..<2 {
            #expect(switchboard.isOwned(shard: shard))
            let ranOn = switchboard.withState(shard: shard, wall: 0) { _ in EventLoop.onCurrentThread { Int($0.index) } }
            #expect(ranOn == shard, "shard \(shard)'s hold ran on loop \(String(describing: ranOn))")
        }
        #expect(server.server.routingShardHandOffs - handOffsBefore == 2)
    }

    @Test("a callback on a running loop's state from another thread runs on the loop's thread; once the loop stopped, on the calling thread under the fallback lock")
    func callbacksHandedToTheLoop() throws {
        let server = try TestServer(workers: 2)
        #expect(server.server.awaitTicks(1))
        for loop in server.server.eventLoops {
            var ranOn: UInt16?
            loop.owned { ranOn = EventLoop.onCurrentThread { $0.index } }
            #expect(ranOn == loop.index)
        }
        #expect(server.server.idleWheelEntries >= 0)
        server.server.beginShutdown()
        while server.server.isRunning {
            server.clock.advance(by: .seconds(1))
            _ = server.server.awaitTicks(1, timeout: .milliseconds(50))
        }
        let holdsBefore = LockHolds.offLoop.snapshot(.loopOwnership).count
        for loop in server.server.eventLoops {
            var ranOn: UInt16? = 99
            loop.owned { ranOn = EventLoop.onCurrentThread { $0.index } }
            #expect(ranOn == nil)
        }
        #expect(LockHolds.offLoop.snapshot(.loopOwnership).count >= holdsBefore + 2)
    }

    @Test("start returns once every loop owns its shard: a hold right after it goes to the owner, never through the fallback lock")
    func ownedWhenStartReturns() throws {
        for _ in 0..<5 {
            let server = try TestServer(workers: 2)
            let switchboard = server.server.switchboard
            #expect((0..<2).allSatisfy { switchboard.isOwned(shard: $0) })
            _ = switchboard.withState(shard: 1, wall: 0) { $0.knows("anyone") }
            #expect(server.server.routingShardLockHolds == 0)
        }
    }

    @Test("the start-up load of a store's devices and pending events takes no shard's fallback lock: the state is set up before any other thread can reach it")
    func startUpLoadWithoutTheLock() throws {
        let store = ModelEventStore()
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        do {
            let server = try TestServer(workers: 2, store: store)
            // The phone never acknowledges: the event stays stored.
            let (phone, _) = try server.connect(user: bob)
            let (sender, _) = try server.connect(user: alice)
            #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
            #expect(try phone.nextMessageIDs(1, acknowledging: false) == ["m1"])
        }
        #expect(store.events(user: bob, device: "d1").count == 1, "the message was not stored")

        let server = try TestServer(workers: 2, store: store)
        #expect(server.server.awaitTicks(1))
        // Without the set-up, the push routing and the load were one fallback-lock hold of
        // each shard apiece (a load of a million devices: a hold of seconds).
        #expect(server.server.routingShardLockHolds == 0)
        let (phone, _) = try server.connect(user: bob)
        #expect(try phone.nextMessageIDs(1) == ["m1"], "the loaded event was not delivered")
    }

    @Test("admin calls that read and change shards while their loops run are answered by the owner loops: no thread takes a shard's fallback lock")
    func adminCallsHandedToOwners() throws {
        let server = try TestServer(workers: 2, store: ModelEventStore()) {
            $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0, token: nil)
        }
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (sender, _) = try server.connect(user: alice)
        let (recipient, _) = try server.connect(user: bob)
        let fallbackBefore = server.server.routingShardLockHolds
        let handOffsBefore = server.server.routingShardHandOffs

        #expect(try http(server, "GET", "/v1/users/\(bob)/devices").status == 200)
        let sent = try http(server, "POST", "/v1/messages", json: #"{"to":"\#(bob)","messageId":"a1","body":"hi","from":"\#(alice)"}"#)
        #expect(sent.status == 200)
        guard case .message(let delivered) = try recipient.nextEvent().event else { Issue.record("not delivered"); return }
        #expect(delivered.messageID == "a1")
        #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
        #expect(try http(server, "DELETE", "/v1/users/\(alice)/devices/d1").status == 200)
        #expect(try http(server, "GET", "/metrics").status == 200)
        #expect(server.server.statistics.messagesAccepted == 2)

        #expect(server.server.routingShardLockHolds == fallbackBefore, "a thread took a shard's fallback lock while its owner ran")
        // The recipient's check and the sender's hold of the message, its step in bob's
        // shard, the listing, the revocation, and the counters of each shard (twice).
        #expect(server.server.routingShardHandOffs - handOffsBefore >= 9)
    }

    @Test("while and after the server stops (each loop's inbox closed), calls that need a shard are answered through its fallback lock, and none hangs")
    func fallbackOnceTheOwnersStop() throws {
        let server = try TestServer(workers: 2) {
            $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0, token: nil)
        }
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        _ = try server.connect(user: alice)
        _ = try server.connect(user: bob)
        let switchboard = server.server.switchboard
        let adminPort = server.server.adminPort!

        // Another thread keeps reading and changing both shards (as the admin API and the
        // push gateway do) while the loops stop: its holds go to the owners, then, once an
        // owner has let go, through the fallback lock; a post refused because the inbox
        // just closed falls back too.
        let progress = Progress()
        let caller = JoinableThread(name: "caller") {
            while true {
                let stopped = progress.stopping.load(ordering: .acquiring)
                _ = switchboard.counters
                for user in [alice, bob] {
                    _ = switchboard.withState(of: user, wall: 0) { $0.knows(user) }
                }
                // The admin API stops after the loops: until then it still answers.
                _ = try? HTTPRequest.send("GET", port: adminPort, "/v1/users/\(bob)/devices", timeout: .seconds(2))
                progress.calls.add(1, ordering: .relaxed)
                if stopped {
                    if progress.callsAfterStop.add(1, ordering: .relaxed).newValue >= 3 { break }
                }
            }
            progress.finished.store(true, ordering: .releasing)
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while progress.calls.load(ordering: .relaxed) < 3 && ContinuousClock.now < deadline { sched_yield() }
        server.server.beginShutdown()
        while server.server.isRunning && ContinuousClock.now < deadline {
            server.clock.advance(by: .seconds(1))
            _ = server.server.awaitTicks(1, timeout: .milliseconds(50))
        }
        #expect(!server.server.isRunning)
        for shard in 0..<2 { #expect(!switchboard.isOwned(shard: shard), "loop \(shard) still owns its shard after it stopped") }
        progress.stopping.store(true, ordering: .releasing)
        while !progress.finished.load(ordering: .acquiring) && ContinuousClock.now < deadline { sched_yield() }
        guard progress.finished.load(ordering: .acquiring) else {
            // Not joined: the thread is stuck waiting for an owner that stopped.
            Issue.record("a call that needed a shard hung while the server stopped")
            return
        }
        caller.join()

        // With every owner gone, a hold runs on the calling thread under the fallback lock.
        let fallbackBefore = server.server.routingShardLockHolds
        let handOffsBefore = server.server.routingShardHandOffs
        let ranOn = switchboard.withState(of: bob, wall: 0) { _ in EventLoop.onCurrentThread { $0.index } }
        #expect(ranOn == nil)
        #expect(server.server.statistics.openConnections == 0)
        #expect(server.server.routingShardLockHolds - fallbackBefore == 3)  // bob's hold, then the counters of both
        #expect(server.server.routingShardHandOffs == handOffsBefore)
    }

    /// What the calling thread of `fallbackOnceTheOwnersStop` and the test share.
    final class Progress: Sendable {
        let stopping = Atomic<Bool>(false)
        let calls = Atomic<Int>(0)
        let callsAfterStop = Atomic<Int>(0)
        let finished = Atomic<Bool>(false)
    }
}
