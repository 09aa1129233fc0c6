import SignalingSupport
import Synchronization
import TestSupport
import Testing
@testable import SignalingServer

/// The admission control, the reloadable handshake material and a message's parts, which
/// every loop shares without a lock: hammered from several threads at once, each checked
/// against what a lock would guarantee.
@Suite("Lock-free admission and handshake state")
struct LockFreeAdmissionTests {
    final class Cell: Sendable {
        let value = Atomic<Int>(0)
    }

    final class Tally: Sendable {
        /// Connections each address has counted now, as the threads know them.
        let live: [Cell]
        let overLimit = Atomic<Int>(0)
        let counted = Atomic<Int>(0)
        let refused = Atomic<Int>(0)
        let uncounted = Atomic<Int>(0)
        init(addresses: Int) { live = (0..<addresses).map { _ in Cell() } }
    }

    @Test("connections accepted and closed by several threads at once: the limit is never passed and every count comes back to zero")
    func perAddressCountsUnderContention() {
        // Eight addresses with the same low bits: all in one window, so every claim of a
        // first connection races with the others for the same slots.
        let addresses = (0..<8).map { UInt32($0) << 16 | 5 }
        let counts = AddressCounts(slotCount: 1 << 12)
        // A limit of 1: nearly every admission is an address's first connection (a claim)
        // and nearly every release frees its slot, the most racy case.
        let limit = 1
        let tally = Tally(addresses: addresses.count)
        let running = Atomic<Bool>(true)
        let watcher = JoinableThread {
            // Another thread reading the counts meanwhile never sees one above the limit.
            while running.load(ordering: .relaxed) {
                for address in addresses where counts.count(of: address) > limit { tally.overLimit.add(1, ordering: .relaxed) }
            }
        }
        onThreads(4) { thread in
            var random = FastRandom(seed: UInt64(thread + 1))
            var held: [Int] = []
            for _ in 0..<50_000 {
                if held.count < 4, random.below(2) != 0 {
                    let which = random.below(addresses.count)
                    switch counts.admit(addresses[which], limit: limit) {
                    case .counted:
                        tally.counted.add(1, ordering: .relaxed)
                        if tally.live[which].value.add(1, ordering: .relaxed).newValue > limit { tally.overLimit.add(1, ordering: .relaxed) }
                        held.append(which)
                    case .refused: tally.refused.add(1, ordering: .relaxed)
                    case .uncounted: tally.uncounted.add(1, ordering: .relaxed)
                    }
                } else if !held.isEmpty {
                    let which = held.remove(at: random.below(held.count))
                    tally.live[which].value.subtract(1, ordering: .relaxed)
                    counts.release(addresses[which])
                }
            }
            for which in held {
                tally.live[which].value.subtract(1, ordering: .relaxed)
                counts.release(addresses[which])
            }
        }
        running.store(false, ordering: .relaxed)
        watcher.join()
        #expect(tally.overLimit.load(ordering: .relaxed) == 0, "an address counted more than \(limit) connections")
        #expect(addresses.map { counts.count(of: $0) } == Array(repeating: 0, count: addresses.count))
        #expect(tally.counted.load(ordering: .relaxed) > 1_000 && tally.refused.load(ordering: .relaxed) > 0,
                "both sides of the limit were exercised")
        // Uncounted only when a claim kept starting again (a claimer preempted between its
        // two steps): rare, never the rule.
        #expect(tally.uncounted.load(ordering: .relaxed) * 100 < tally.counted.load(ordering: .relaxed))
        // Every slot is free again: any address can be counted up to the limit.
        for address in addresses {
            let admissions = (0..<limit).map { _ in counts.admit(address, limit: limit) }
            #expect(admissions == Array(repeating: AddressCounts.Admission.counted, count: limit))
            #expect(counts.admit(address, limit: limit) == .refused)
        }
    }

    @Test("an address whose window is full is admitted uncounted; a close of another makes room for it")
    func fullWindowAdmitsUncounted() {
        // One window of 16 slots is the whole table.
        let counts = AddressCounts(slotCount: AddressCounts.window)
        for address in UInt32(0)..<16 { #expect(counts.admit(address, limit: 2) == .counted) }
        #expect(counts.admit(16, limit: 2) == .uncounted)
        #expect(counts.count(of: 16) == 0)
        // Addresses already in the table are still counted and limited.
        #expect(counts.admit(3, limit: 2) == .counted)
        #expect(counts.admit(3, limit: 2) == .refused)
        counts.release(7)
        #expect(counts.admit(16, limit: 2) == .counted)
        #expect(counts.count(of: 16) == 1 && counts.count(of: 3) == 2 && counts.count(of: 7) == 0)
        // A release finds its address's slot wherever the claim put it in the window.
        counts.release(16)
        counts.release(3)
        #expect(counts.count(of: 16) == 0 && counts.count(of: 3) == 1)
    }

    @Test("the table is sized from the descriptor limit: a quarter full at most, 32 KiB to 2 MiB")
    func tableSize() {
        #expect(AddressCounts.slotCount(descriptorLimit: 1024) == 1 << 12)
        #expect(AddressCounts.slotCount(descriptorLimit: 20_000) == 1 << 17)
        #expect(AddressCounts.slotCount(descriptorLimit: 1_100_000) == 1 << 18)
        #expect(AddressCounts.slotCount(descriptorLimit: .max) == 1 << 18)
    }

    @Test("the shared handshake bucket grants exactly its burst, then exactly its refill, however many threads take at once")
    func sharedBucketUnderContention() {
        let start = Instant(nanoseconds: 1_000_000_000)
        // 100,000 a second: 10 µs a token, a burst of 100,000.
        let bucket = SharedTokenBucket(rate: 100_000, burst: 100_000, now: start)
        // Four rounds from a full bucket: two cores race only so often.
        for _ in 0..<4 {
            bucket.reset(rate: 100_000, burst: 100_000, now: start)
            for (now, expected) in [(start, 100_000), (start + .milliseconds(10), 1_000)] {
                let granted = Atomic<Int>(0)
                // Four threads, 60,000 takes each at the same instant: more than there are tokens.
                onThreads(4) { _ in
                    var mine = 0
                    for _ in 0..<60_000 where bucket.tryTake(now: now) { mine += 1 }
                    granted.add(mine, ordering: .relaxed)
                }
                #expect(granted.load(ordering: .relaxed) == expected)
            }
        }
    }

    @Test("the shared bucket answers as the bucket of one thread does, and a reset starts it full at the new pace")
    func sharedBucketMatchesTokenBucket() {
        let start = Instant(nanoseconds: 5_000_000_000)
        var single = TokenBucket(rate: 7, burst: 3, now: start)
        let shared = SharedTokenBucket(rate: 7, burst: 3, now: start)
        var random = FastRandom(seed: 42)
        var now = start
        for _ in 0..<2_000 {
            now = now + .milliseconds(Int64(random.below(200)))
            let expected = single.tryTake(now: now)
            let answer = shared.tryTake(now: now)
            #expect(answer == expected)
        }
        shared.reset(rate: 2, burst: 2, now: now)
        #expect(shared.currentPace == TokenBucket.Pace(rate: 2, burst: 2))
        let takes = [shared.tryTake(now: now), shared.tryTake(now: now), shared.tryTake(now: now)]
        #expect(takes == [true, true, false])
        shared.reset(rate: 0, burst: 0, now: now)
        let unlimited = (0..<100).allSatisfy { _ in shared.tryTake(now: now) }
        #expect(unlimited, "rate 0: unlimited")
    }

    @Test("a reload is seen by every loop at its next read, each reading its own copy")
    func reloadSeenByEveryLoop() {
        let value = Reloadable("old")
        let reloaded = Atomic<Bool>(false)
        let sawNewAfterReload = Atomic<Int>(0)
        let sawOldAfterReload = Atomic<Int>(0)
        let readers = 3
        let ready = Atomic<Int>(0)
        let threads = (0..<readers).map { _ in
            JoinableThread {
                var copy = value.copy()
                let first = value.read(through: &copy)
                #expect(first == "old")
                ready.add(1, ordering: .releasing)
                while !reloaded.load(ordering: .acquiring) { _ = value.read(through: &copy) }
                // Reloaded before this read began: the new value, at once.
                let after = value.read(through: &copy)
                if after == "new" {
                    sawNewAfterReload.add(1, ordering: .relaxed)
                } else {
                    sawOldAfterReload.add(1, ordering: .relaxed)
                }
            }
        }
        while ready.load(ordering: .acquiring) < readers {}
        value.replace(with: "new")
        reloaded.store(true, ordering: .releasing)
        for thread in threads { thread.join() }
        #expect(sawNewAfterReload.load(ordering: .relaxed) == readers)
        #expect(sawOldAfterReload.load(ordering: .relaxed) == 0)
        #expect(value.value == "new")
    }

    @Test("a message's parts pushed by several threads while it is settled: each is taken by the settler or refused to its pusher, none lost")
    func deferredReplyPartsTakenOrRefused() {
        let reply = DeferredReply(
            target: .completion({ _ in }), serverTime: 0, sender: "alice", messageID: "m", deadline: Instant(nanoseconds: 0))
        let event = QueuedEvent(.callRang(callID: "c", device: "d"), createdAt: 0)
        let refused = Atomic<Int>(0)
        let pushed = Atomic<Int>(0)
        let taken = Mutex<[DeferredReply.Part]>([])
        onThreads(4) { thread in
            if thread == 0 {
                // The settler, once the others have pushed some, while they push more.
                while pushed.load(ordering: .relaxed) < 3_000 {}
                let parts = reply.takeParts()
                taken.withLock { $0 = parts }
                return
            }
            for _ in 0..<5_000 {
                if !reply.add(event, shard: thread) { refused.add(1, ordering: .relaxed) }
                pushed.add(1, ordering: .relaxed)
            }
        }
        let takenCount = taken.withLock { $0.count }
        #expect(takenCount + refused.load(ordering: .relaxed) == 3 * 5_000)
        let again = reply.takeParts()
        #expect(again.isEmpty, "taken once")
        let late = reply.add(event, shard: 1)
        #expect(!late, "refused after the take")
    }
}
