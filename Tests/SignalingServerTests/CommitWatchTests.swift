@testable import SignalingServer
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// The store writer's commit under way is one atomic word (`CommitWatch`): the writer
/// begins and ends commits, loop 0 declares one stalled. What must hold without a lock: a
/// stall belongs to the commit it was declared on, never outlives it (new messages would
/// stay refused with nothing running) and is always reported as ended.
@Suite("The commit under way without a lock")
struct CommitWatchTests {
    @Test("a commit is seen with its start and size, declared stalled once, and its end reports the stall and clears it")
    func declaredThenEnded() {
        let watch = CommitWatch()
        #expect(watch.running == nil)
        watch.begin(at: Instant(nanoseconds: 1_000), changes: 7)
        let commit = try! #require(watch.running)
        #expect(commit.started == Instant(nanoseconds: 1_000) && commit.changes == 7 && !commit.stalled)
        #expect(watch.declareStalled(commit.number))
        #expect(watch.isStalled && watch.running?.stalled == true)
        #expect(!watch.declareStalled(commit.number), "declared twice")
        #expect(watch.end() == Instant(nanoseconds: 1_000))
        #expect(!watch.isStalled && watch.running == nil)
    }

    @Test("a stall declared on a commit that has since returned, or been followed by another, is refused")
    func lateDeclarationRefused() {
        let watch = CommitWatch()
        watch.begin(at: Instant(nanoseconds: 5), changes: 1)
        let first = watch.running!.number
        #expect(watch.end() == nil, "an undeclared commit ends without a stall")
        #expect(!watch.declareStalled(first), "declared after its end")
        #expect(!watch.isStalled)
        watch.begin(at: Instant(nanoseconds: 9), changes: 2)
        #expect(watch.running!.number != first)
        #expect(!watch.declareStalled(first), "the old commit's number declared the new one stalled")
        #expect(!watch.isStalled)
        #expect(watch.end() == nil)
    }

    @Test("with the writer beginning and ending commits while loop 0 declares whatever it reads, every stall is reported by its commit's end and none is left behind")
    func concurrentDeclarations() {
        let watch = CommitWatch()
        let commits = 200_000
        let done = Atomic<Bool>(false)
        let declared = Atomic<Int>(0)
        let supervisor = JoinableThread(name: "loop-0") {
            while !done.load(ordering: .acquiring) {
                if let commit = watch.running, !commit.stalled, watch.declareStalled(commit.number) {
                    declared.add(1, ordering: .relaxed)
                }
            }
        }
        var reported = 0
        for number in 1...commits {
            watch.begin(at: Instant(nanoseconds: UInt64(number)), changes: 1)
            if let started = watch.end() {
                #expect(started == Instant(nanoseconds: UInt64(number)), "a stall reported with another commit's start")
                reported += 1
            }
        }
        done.store(true, ordering: .releasing)
        supervisor.join()
        #expect(!watch.isStalled, "a stall outlived its commit")
        #expect(reported == declared.load(ordering: .relaxed), "declared \(declared.load(ordering: .relaxed)), reported \(reported)")
    }
}
