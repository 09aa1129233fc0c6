import SignalingSupport
import TestSupport
import Testing
@testable import SignalingServer

/// `routing-bench scaling` (`FanOutScaling`): the users it fans out to are spread evenly
/// over the shards, and a run across threads delivers and acknowledges every copy through
/// the loops' inboxes (in debug builds `Switchboard` also checks that each thread takes
/// its own shard's lock only).
@Suite("Fan-out scaling benchmark")
struct FanOutScalingTests {
    @Test("the users are spread over the shards as evenly as can be", arguments: [1, 2, 3, 4, 16])
    func usersSpreadEvenly(shards: Int) {
        for count in [1, 7, 64, 100] {
            let users = FanOutScaling.users(count: count, shardCount: shards)
            #expect(users.count == count)
            #expect(Set(users).count == count)
            var perShard = Array(repeating: 0, count: shards)
            for user in users { perShard[ShardMap.shard(of: user, count: shards)] += 1 }
            #expect(perShard.max()! - perShard.min()! <= (count % shards == 0 ? 0 : 1), "\(count) users: \(perShard)")
        }
    }

    @Test("a run on two threads queues every copy and every receipt, crossing shards through the inboxes")
    func twoThreadsDeliverEverything() throws {
        // 64 messages of 16 devices in flight: many more receipts than an ACK's chunk (128)
        // reach a sender between two of its turns, so its ACKs take them out over several
        // holds (and the run must count them once, not stop early).
        let figures = try FanOutScaling.run(threads: 2, users: 8, devicesPerUser: 16, messagesPerThread: 200, window: 64)
        // Each message: a copy to each of the user's 16 devices and a receipt for each.
        #expect(figures.events == 2 * 200 * 16 * 2)
        // Half of the users live on the other thread's shard: their steps were posted.
        #expect(figures.stepsPosted > 0)
        #expect(figures.threadCPUSeconds.count == 2)
        // Each thread's turns are counted: some found work, waits are idle turns that slept.
        #expect(figures.turns.count == 2)
        for counts in figures.turns {
            #expect(counts.turns > counts.idle && counts.idle >= counts.waits && counts.waits >= counts.timeouts)
            #expect(counts.blockedSeconds >= 0 && counts.wakeUpsWritten >= 0)
        }
    }

    @Test("with a busy-poll window a run on two threads still delivers everything, its idle threads turning before they sleep")
    func busyPollDeliversEverything() throws {
        let figures = try FanOutScaling.run(
            threads: 2, users: 8, devicesPerUser: 16, messagesPerThread: 200, window: 64, busyPoll: .milliseconds(1))
        #expect(figures.events == 2 * 200 * 16 * 2)
        for counts in figures.turns { #expect(counts.idle >= counts.waits) }
    }

    @Test("the ACKs of one callback without a store share one step chain: a new one for another millisecond and for the next callback")
    func acknowledgementsShareAChainPerCallback() throws {
        let context = ServerContext(
            configuration: ServerConfiguration(), clock: ManualClock(), logger: .silent, journaling: false, pushGateway: nil,
            tokenVerifier: nil)
        let loop = try EventLoop(index: 0, context: context, listenFD: -1)
        defer { loop.owned { loop.table.deallocate() } }
        let now = Instant(nanoseconds: 1)
        var first: StepChain?
        var again: StepChain?
        var later: StepChain?
        loop.owned {
            first = loop.acknowledgementChain(now: now, wall: 10)
            again = loop.acknowledgementChain(now: now, wall: 10)
            later = loop.acknowledgementChain(now: now, wall: 11)
        }
        var next: StepChain?
        loop.owned { next = loop.acknowledgementChain(now: now, wall: 11) }
        #expect(first === again)
        #expect(later !== first && later?.wall == 11)
        #expect(next !== later, "a chain outlived its callback")
        #expect(first?.requester == nil && first?.group == nil && first?.awaitsAnswer == false)
    }

    @Test("the host's ceiling: independent threads each fan out to every user on a server of their own, posting nothing and waking no one")
    func independentThreadsShareNothing() throws {
        let figures = try FanOutScaling.run(
            threads: 2, users: 8, devicesPerUser: 16, messagesPerThread: 200, window: 64, independent: true)
        // Each thread's 200 messages to users of 16 devices, counted on both servers.
        #expect(figures.events == 2 * 200 * 16 * 2)
        // All the users are on each thread's one shard: nothing crosses.
        #expect(figures.stepsPosted == 0)
        #expect(figures.threadCPUSeconds.count == 2)
        #expect(figures.turns.map(\.wakeUpsWritten) == [0, 0])
    }

    @Test("routing-bench scaling runs the host's ceiling beside a second count, and a single count alone, as the callgrind and shared-count scripts run it")
    func ceilingOnlyBesideAnotherCount() throws {
        let small = ["--users", "4", "--devices", "2", "--messages", "40", "--rounds", "1"]
        let pair = try ExecutableRun.run("routing-bench", ["scaling", "--threads", "1 2"] + small, timeoutSeconds: 60)
        #expect(pair.exitCode == 0, "\(pair.stderr)")
        #expect(pair.stdout.contains("2 indep  1"))
        #expect(pair.stdout.contains("host ceiling, 2 independent one-shard servers / threads 1"))
        #expect(pair.stdout.contains("within each round: threads 2 / threads 1"))
        // `Tools/bench-fanout-callgrind` and `Tools/bench-shared-counts` divide the whole
        // process's counts by the sharded run's events: an independent run beside it
        // doubled them (7,043 instructions per event instead of 3,683).
        let single = try ExecutableRun.run("routing-bench", ["scaling", "--threads", "2"] + small, timeoutSeconds: 60)
        #expect(single.exitCode == 0, "\(single.stderr)")
        #expect(!single.stdout.contains("indep"))
        let off = try ExecutableRun.run("routing-bench", ["scaling", "--threads", "1 2", "--ceiling", "no"] + small, timeoutSeconds: 60)
        #expect(off.exitCode == 0 && !off.stdout.contains("indep"))
    }

    @Test("a run on one thread posts no step: everything is its own shard's")
    func oneThreadPostsNothing() throws {
        let figures = try FanOutScaling.run(threads: 1, users: 4, devicesPerUser: 2, messagesPerThread: 10, window: 2)
        #expect(figures.events == 10 * 2 * 2)
        #expect(figures.stepsPosted == 0)
        // Nothing is posted, so nothing wakes it.
        #expect(figures.turns.map(\.wakeUpsWritten) == [0])
    }
}
