#if canImport(Glibc)
import Glibc
#endif
import Synchronization

// No lock in this file (docs/ARCHITECTURE.md, "Locks"): every loop counts its accepts and
// closes in the one table, each slot an atomic word changed by compare-and-exchange.

/// Open connections per address, counted by every loop without a lock: a fixed table of
/// atomic slots, each one word holding an address and its count.
///
/// An address (a 32-bit FNV-1a hash of its IP, `shim_address_hash`: already a stable hash,
/// so its low bits pick its place, no second hash) lives in one slot of its *window*, the
/// `window` slots from `address & mask` on. A slot word is the address in its high 32
/// bits, a *pending* mark in bit 31 and the count in the 31 below; a count of 0 with no
/// mark is a free slot, whatever address it names.
///
/// - Counting into the address's slot (*live*: count > 0) is one compare-and-exchange of
///   count → count + 1, refused at the limit: the limit holds exactly, for any number of
///   threads.
/// - An address with no slot claims the first free one of its window in two steps: a
///   compare-and-exchange marks it *pending* (the address, no count), then the window is
///   read again, and if any other slot holds the address (live or pending: another thread
///   counting the same address's first connection at the same moment) the mark is undone
///   and the whole admission starts again; else the slot goes live with a count of 1. Of
///   two threads claiming for one address, each marks before it reads again
///   (sequentially consistent operations), so at least one sees the other and backs off:
///   **an address is never live in two slots**, which is what makes the limit exact and
///   lets a release find its slot by looking (below). A thread that finds the address
///   pending starts again too (it may not add to a slot that is not yet decided).
/// - A release finds the address's live slot in its window again and takes 1 from it
///   (one compare-and-exchange); at 0 the slot is free for any address. The connection
///   keeps no slot number: the one live slot of its address is where it was counted.
///
/// Failure mode, never a lock and never a refusal the limit does not call for: when every
/// slot of the window is held by other addresses, or when the claim started again
/// `attempts` times (another thread kept a pending mark of the same address that long,
/// say preempted between its two steps; past `quickAttempts` each start yields the CPU
/// first, so that such a thread can finish), the connection is admitted **uncounted**
/// (`Admission.uncounted`, counted by the caller in a metric): it is not counted against
/// its address's limit and its close releases nothing. How often windows are full, by how
/// full the table is (a simulation of random addresses placed in 2^16 slots, windows of
/// 16, 200,000 new addresses each): a quarter full, none; 3/8, 0.03 %; half, 0.4 %; three
/// quarters, 12 %. `slotCount(descriptorLimit:)` sizes it at most a quarter full.
///
/// Cost: an admission or a release reads the window (16 words: two cache lines) and makes
/// one compare-and-exchange, two atomic stores and a second read of the window when the
/// address is new. Memory: 8 bytes a slot, allocated zeroed (`calloc`): pages the table
/// never touched cost nothing resident, and each one touched is 4 KiB (512 slots).
final class AddressCounts: @unchecked Sendable {
    /// Slots an address may live in, from its first.
    static let window = 16
    /// Starts of a claim before an admission gives up and admits uncounted.
    static let attempts = 64
    /// Starts of a claim made at once; each later one first yields the CPU.
    static let quickAttempts = 8

    /// `calloc`'d words (zero: free), each used only through its `Atomic`.
    private let slots: UnsafeMutablePointer<Atomic<UInt64>>
    private let mask: Int

    /// What `admit` did.
    enum Admission: Equatable, Sendable {
        /// Counted: the connection's close must `release` it.
        case counted
        /// Over the limit: nothing was counted.
        case refused
        /// Admitted without being counted (a full window, or a claim that kept starting
        /// again): its close releases nothing.
        case uncounted
    }

    /// `slotCount` a power of two, at least `window`.
    init(slotCount: Int) {
        precondition(slotCount >= Self.window && slotCount & (slotCount - 1) == 0, "a power of two of at least a window")
        let memory = calloc(slotCount, MemoryLayout<Atomic<UInt64>>.stride)!
        // An `Atomic<UInt64>` is laid out as its value: zeroed memory is a table of zeros.
        slots = memory.bindMemory(to: Atomic<UInt64>.self, capacity: slotCount)
        mask = slotCount - 1
    }

    deinit { free(slots) }

    /// The table for a process that may have `descriptorLimit` descriptors open (one per
    /// connection, so at most that many addresses): four times as many slots, so that it
    /// is at most a quarter full, between 2^12 (32 KiB) and 2^18 (2 MiB, the size for
    /// 65,536 descriptors or more: `LimitNOFILE=1100000` in deploy/). Past 65,536 distinct
    /// addresses at once the table is more than a quarter full, and a growing share of new
    /// addresses is admitted uncounted (above).
    static func slotCount(descriptorLimit: UInt64) -> Int {
        let wanted = max(UInt64(1) << 12, min(UInt64(1) << 18, min(descriptorLimit, 1 << 20) * 4))
        return 1 << (64 - (wanted - 1).leadingZeroBitCount)
    }

    private static let pendingBit: UInt64 = 1 << 31
    private static let countMask: UInt64 = pendingBit - 1

    @inline(__always)
    private static func word(_ address: UInt32, count: UInt64) -> UInt64 { UInt64(address) << 32 | count }

    /// The slot holds `address`, live or pending.
    @inline(__always)
    private static func holds(_ word: UInt64, _ address: UInt32) -> Bool {
        UInt32(truncatingIfNeeded: word >> 32) == address && word & (pendingBit | countMask) != 0
    }

    @inline(__always)
    private func slot(_ address: UInt32, _ offset: Int) -> Int { (Int(address) &+ offset) & mask }

    /// Counts one more connection from `address` unless it has `limit` already.
    func admit(_ address: UInt32, limit: Int) -> Admission {
        guard limit > 0 else { return .refused }
        let limit = UInt64(min(limit, Int(Self.countMask)))
        attempt: for attempt in 0..<Self.attempts {
            // Past a few quick retries, the thread that keeps its pending mark is likely
            // preempted (more runnable threads than cores): give it the CPU. A yield, not
            // a wait: with nobody else runnable here it returns at once.
            if attempt >= Self.quickAttempts { sched_yield() }
            var free: (index: Int, word: UInt64)?
            for offset in 0..<Self.window {
                let index = slot(address, offset)
                var word = slots[index].load(ordering: .sequentiallyConsistent)
                if Self.holds(word, address) {
                    // Another thread's claim of this address is undecided: start again.
                    guard word & Self.pendingBit == 0 else { continue attempt }
                    while true {
                        guard word & Self.countMask < limit else { return .refused }
                        let (exchanged, found) = slots[index].compareExchange(
                            expected: word, desired: word + 1, ordering: .sequentiallyConsistent)
                        if exchanged { return .counted }
                        word = found
                        // Released to 0 meanwhile (and maybe claimed by another address).
                        guard Self.holds(word, address), word & Self.pendingBit == 0 else { continue attempt }
                    }
                }
                if free == nil, word & (Self.pendingBit | Self.countMask) == 0 { free = (index, word) }
            }
            guard let free else { return .uncounted }
            let pending = Self.word(address, count: 0) | Self.pendingBit
            guard slots[free.index].compareExchange(
                expected: free.word, desired: pending, ordering: .sequentiallyConsistent
            ).exchanged else { continue attempt }
            for offset in 0..<Self.window {
                let index = slot(address, offset)
                guard index != free.index else { continue }
                if Self.holds(slots[index].load(ordering: .sequentiallyConsistent), address) {
                    slots[free.index].store(0, ordering: .sequentiallyConsistent)
                    continue attempt
                }
            }
            // Nobody adds to a pending slot: this thread alone changes it.
            slots[free.index].store(Self.word(address, count: 1), ordering: .sequentiallyConsistent)
            return .counted
        }
        return .uncounted
    }

    /// Takes back one connection `admit` counted for `address`.
    func release(_ address: UInt32) {
        for offset in 0..<Self.window {
            let index = slot(address, offset)
            var word = slots[index].load(ordering: .sequentiallyConsistent)
            // The live slot of the address holds this connection's count, so it stays
            // this address's until the subtraction below.
            guard Self.holds(word, address), word & Self.pendingBit == 0 else { continue }
            while true {
                let (exchanged, found) = slots[index].compareExchange(
                    expected: word, desired: word - 1, ordering: .sequentiallyConsistent)
                if exchanged { return }
                word = found
            }
        }
        assertionFailure("released a connection its address never counted")
    }

    /// Connections counted for `address` now (tests, diagnostics).
    func count(of address: UInt32) -> Int {
        for offset in 0..<Self.window {
            let word = slots[slot(address, offset)].load(ordering: .sequentiallyConsistent)
            if Self.holds(word, address), word & Self.pendingBit == 0 { return Int(word & Self.countMask) }
        }
        return 0
    }
}
