import CLinuxShims
@testable import SignalingServer
import SignalingSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A post to a loop writes its eventfd only when the loop may be asleep
/// (`EventLoop.mayBeAsleep`): a loop running callbacks looks at its inbox before it sleeps
/// again, so posts meanwhile cost no system call. What must hold: no post is ever left
/// waiting for a wake-up that nobody wrote.
@Suite("Loop wake-ups: an eventfd write only for a loop that may be asleep")
struct LoopWakeUpTests {
    /// A task that does nothing to a loop without connections (the slot is not live).
    static let harmless = LoopTask.bodiesLoaded(ConnectionRef(loop: 0, slot: 7, generation: 1))

    @Test("posts to a loop that runs a callback write no eventfd and are found before it sleeps; posts to a loop that prepared to sleep write one per batch; a callback run by another thread does not count as the loop awake")
    func wakeUpsOnlyForASleepingLoop() throws {
        let context = ServerContext(
            configuration: ServerConfiguration(), clock: ManualClock(), logger: .silent, journaling: false, pushGateway: nil,
            tokenVerifier: nil)
        let loop = try EventLoop(index: 0, context: context, listenFD: -1)
        defer { loop.owned { loop.table.deallocate() } }
        // This thread drives the loop, as its own thread would.
        shim_set_current_loop(Unmanaged.passUnretained(loop).toOpaque())
        defer { shim_set_current_loop(nil) }

        // A new loop may be asleep: the first post wakes it, the second finds the batch.
        #expect(loop.post(Self.harmless) && loop.post(Self.harmless))
        #expect(loop.wakeUpsWritten.load(ordering: .relaxed) == 1)
        loop.owned { loop.runInbox() }

        // Awake (a callback ran on its thread): no write, and the task is found.
        #expect(loop.post(Self.harmless))
        #expect(loop.wakeUpsWritten.load(ordering: .relaxed) == 1, "a post to a loop in its callbacks wrote the eventfd")
        #expect(!loop.prepareToSleep(), "the loop would have slept with a task in its inbox")
        loop.owned { loop.runInbox() }

        // Prepared to sleep with nothing waiting: the next post wakes it.
        #expect(loop.prepareToSleep())
        #expect(loop.post(Self.harmless))
        #expect(loop.wakeUpsWritten.load(ordering: .relaxed) == 2)
        loop.owned { loop.runInbox() }

        // Another thread running a callback of the loop (tests, benchmarks) says nothing
        // about the loop's own thread, which may be asleep meanwhile.
        #expect(loop.prepareToSleep())
        JoinableThread(name: "other") { loop.owned {} }.join()
        #expect(loop.post(Self.harmless))
        #expect(loop.wakeUpsWritten.load(ordering: .relaxed) == 3, "a callback on another thread marked the loop awake")
        loop.owned { loop.runInbox() }
    }

    @Test("four threads post to a running loop, in bursts and one at a time, while it sleeps and wakes: every post is taken within 300 ms, well before the next tick could take it")
    func noPostWaitsForATick() throws {
        // Ticks 1 s apart: a post left without its wake-up would wait for one.
        let server = try TestServer(workers: 1) { $0.tickInterval = .seconds(1) }
        let loop = try #require(server.server.eventLoops.first)
        let clock = SystemClock()
        @Sendable func taken(within limit: Duration) -> Bool {
            let deadline = clock.now() + limit
            while loop.inboxHasTasks {
                if clock.now() > deadline { return false }
                sched_yield()
            }
            return true
        }
        let lost = Atomic<Int>(0)
        let posters = (0..<4).map { poster in
            JoinableThread(name: "poster-\(poster)") {
                for round in 0..<300 {
                    // A burst (the loop is likely awake for most of it), then a lone post
                    // after the loop has had time to fall asleep.
                    for _ in 0..<(round % 7) { _ = loop.post(Self.harmless) }
                    if !taken(within: .milliseconds(300)) { lost.add(1, ordering: .relaxed) }
                    if round % 3 == poster % 3 { usleep(200) }
                    _ = loop.post(Self.harmless)
                    if !taken(within: .milliseconds(300)) { lost.add(1, ordering: .relaxed) }
                }
            }
        }
        for poster in posters { poster.join() }
        #expect(lost.load(ordering: .relaxed) == 0, "posts waited past 300 ms for a wake-up")
    }
}
