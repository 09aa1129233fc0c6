import SignalingSupport
import Synchronization
import SignalingProtocol
import TestSupport
import Testing
@testable import SignalingServer

/// The server's live call ids (`CallDirectory`): a lock-free table with a locked overflow,
/// whose answers must be those of one locked set (docs/PROTOCOL.md 6.1: `callIdInUse`;
/// `notCallParticipant` against `unknownCall`).
@Suite("Call directory")
struct CallDirectoryTests {
    /// How many threads hold each id now, as they know it, and what went wrong.
    final class Tally: Sendable {
        let holders = Mutex<[String: Int]>([:])
        let doubleClaims = Atomic<Int>(0)
        let missing = Atomic<Int>(0)
        let wins = Atomic<Int>(0)

        /// A thread won `id`: nobody else may hold it.
        func won(_ id: String) {
            wins.add(1, ordering: .relaxed)
            holders.withLock { holders in
                holders[id, default: 0] += 1
                if holders[id]! > 1 { doubleClaims.add(1, ordering: .relaxed) }
            }
        }

        /// The thread that won `id` gives it up (before releasing it).
        func givingUp(_ id: String) { holders.withLock { $0[id, default: 0] -= 1 } }
    }

    static let longID = String(repeating: "x", count: 100)

    @Test("an id is in use from its claim to its release, then free to claim again; other ids are unknown")
    func claimAndRelease() {
        let directory = CallDirectory()
        for id in ["c1", "0f8e4c2a-5b1d-4e7f-9a3c-2d6b8e1f0a94", String(repeating: "y", count: 48), Self.longID] {
            #expect(!directory.contains(id))
            #expect(directory.claim(id))
            #expect(!directory.claim(id), "\(id) is in use")
            #expect(directory.contains(id))
            #expect(!directory.contains(id + "z") && !directory.contains(String(id.dropLast())))
            directory.release(id)
            #expect(!directory.contains(id))
            #expect(directory.claim(id), "\(id) again after its release")
            directory.release(id)
        }
        #expect(directory.overflowCount == 0)
    }

    @Test("short ids take no lock; an id longer than a slot holds goes through the overflow and is answered the same")
    func shortIDsStayInTheTable() {
        let directory = CallDirectory()
        for index in 0..<500 { #expect(directory.claim("call-\(index)")) }
        #expect(directory.overflowCount == 0, "500 live short ids, all in the table")
        #expect(directory.claim(Self.longID))
        #expect(directory.overflowCount == 1)
        #expect(!directory.claim(Self.longID) && directory.contains(Self.longID))
        directory.release(Self.longID)
        #expect(directory.overflowCount == 0 && !directory.contains(Self.longID))
    }

    @Test("calls over real sockets claim and release their ids without a lock: no loop records a call_directory hold")
    func noLockOnTheCallPath() throws {
        let server = try TestServer(workers: 2)
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        for index in 1...3 {
            let callID = "0f8e4c2a-5b1d-4e7f-9a3c-\(index)"
            #expect(try alice.request(UInt32(2 * index), .callInvite(callID: callID, callee: "bob", offer: Array("v=0".utf8))).isOK)
            #expect(try alice.request(UInt32(2 * index + 1), .callCancel(callID: callID)).isOK)
        }
        _ = bob
        // The loops' own histograms: the scrape's sum also has the process-wide off-loop
        // holds, which other tests running meanwhile add to.
        let holds = server.server.eventLoops.map { $0.metrics.lockHolds.snapshot(.callDirectory).count }
        #expect(holds.reduce(0, +) == 0)
        // Their holds of their own routing shards take no lock, but are timed.
        let routing = server.server.eventLoops.map { $0.metrics.routingLockHold.snapshot().count }
        #expect(routing.reduce(0, +) > 0, "the loops did record their holds")
    }

    @Test("a table with no room: ids spill into the overflow, and every answer stays exact")
    func fullTable() {
        // One window's worth of slots: past `window` ids, none has a free slot.
        let directory = CallDirectory(slotCount: CallDirectory.window)
        let ids = (0..<40).map { "call-\($0)" }
        for id in ids { #expect(directory.claim(id)) }
        #expect(directory.overflowCount == ids.count - CallDirectory.window)
        for id in ids {
            #expect(!directory.claim(id), "\(id) is in use wherever it lives")
            #expect(directory.contains(id))
        }
        #expect(!directory.contains("call-40"))
        // Freed table slots take new ids while the overflow still holds others: an id in the
        // overflow is never claimed a second time in the table.
        for id in ids.prefix(20) { directory.release(id) }
        for id in ids { #expect(directory.contains(id) == !ids.prefix(20).contains(id)) }
        for id in ids.suffix(20) { #expect(!directory.claim(id)) }
        for id in ids.prefix(20) { #expect(directory.claim(id)) }
        for id in ids { directory.release(id) }
        #expect(directory.overflowCount == 0)
        for id in ids { #expect(!directory.contains(id)) }
    }

    @Test("threads claiming the same ids at once: exactly one wins each, in the table, the overflow, or both")
    func oneWinnerEach() {
        for slotCount in [1 << 13, CallDirectory.window] {
            let directory = CallDirectory(slotCount: slotCount)
            let ids = (0..<2_000).map { $0 % 10 == 0 ? "\($0)-" + Self.longID : "call-\($0)" }
            let wins = Mutex<[String: Int]>([:])
            onThreads(4) { thread in
                var mine: [String] = []
                // Each thread in another order, so that they meet on every id.
                let order = thread % 2 == 0 ? ids : Array(ids.reversed())
                for id in order where directory.claim(id) { mine.append(id) }
                wins.withLock { wins in for id in mine { wins[id, default: 0] += 1 } }
            }
            let counted = wins.withLock { $0 }
            #expect(counted.count == ids.count, "every id was won (table of \(slotCount))")
            #expect(counted.values.allSatisfy { $0 == 1 }, "by one thread only (table of \(slotCount))")
            for id in ids { #expect(directory.contains(id)) }
            for id in ids { directory.release(id) }
            #expect(directory.overflowCount == 0)
            for id in ids { #expect(!directory.contains(id)) }
        }
    }

    @Test("threads claiming, releasing and claiming again a few ids: never two holders of one id, none lost")
    func releaseThenReclaim() {
        for slotCount in [1 << 13, CallDirectory.window] {
            let directory = CallDirectory(slotCount: slotCount)
            // More ids than a window: with the small table some live in the overflow, and
            // they move between the two as slots free up.
            let ids = (0..<24).map { "call-\($0)" } + ["long-" + Self.longID]
            let tally = Tally()
            onThreads(4) { thread in
                var random = FastRandom(seed: UInt64(thread + 1))
                for _ in 0..<20_000 {
                    let id = ids[random.below(ids.count)]
                    guard directory.claim(id) else { continue }
                    tally.won(id)
                    if !directory.contains(id) { tally.missing.add(1, ordering: .relaxed) }
                    tally.givingUp(id)
                    directory.release(id)
                }
            }
            #expect(tally.doubleClaims.load(ordering: .relaxed) == 0, "table of \(slotCount)")
            #expect(tally.missing.load(ordering: .relaxed) == 0, "a claimed id is found by its holder")
            #expect(tally.wins.load(ordering: .relaxed) > 1_000)
            #expect(directory.overflowCount == 0)
            for id in ids {
                #expect(!directory.contains(id))
                #expect(directory.claim(id))
            }
        }
    }
}
