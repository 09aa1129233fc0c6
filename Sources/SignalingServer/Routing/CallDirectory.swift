#if canImport(Glibc)
import Glibc
#endif
import Synchronization

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): `overflow`, a leaf, taken (under a
// shard lock) only by the claims, releases and lookups of the call ids the table cannot
// hold (longer than `inlineBytes`, a full window, a claim that kept starting again) and of
// ids whose home has such an id now (`overflowed`). The table itself takes no lock: every
// slot is changed by compare-and-exchange and atomic stores.

/// The live call ids of the whole server. A call lives in its callee's shard, but its id
/// is unique server-wide (docs/PROTOCOL.md 6.1: `callIdInUse`), and a device that is no
/// party to a call learns `notCallParticipant`, not `unknownCall`, whichever shard it is
/// on: both need to know ids of other shards' calls. Every answer is exact: ids are
/// compared byte for byte, never by hash alone.
///
/// Taken under a shard lock by call requests (a claim; a lookup for a call of another
/// shard) and call endings (a release), never by messages, acknowledgements or pumps. With
/// shards on several nodes this is the one piece to share (a Redis set with SET NX).
///
/// **No lock on the per-call path**: a fixed table of slots of atomic words (the same
/// scheme as `AddressCounts`, with the id itself in the slot so that lookups are exact).
/// An id (its UTF-8 bytes, at most `inlineBytes`) lives in one slot of its *window*, the
/// `window` slots from its *home* (`hash & mask`, from the per-process seeded `Hasher`,
/// so that nobody can aim ids at one window). A slot is a *state* word (free / pending /
/// live, the id's length and a 32-bit fingerprint from the hash's high bits, and a
/// version bumped at every change), a word counting the ids whose home this slot is that
/// live in the overflow (`overflowed`), and six words of id bytes; the state words are
/// one dense array, so that a window's are 128 contiguous bytes, and the bytes are read only
/// for a state word with the id's fingerprint and length.
///
/// - A claim reads the window: a live slot with the id's fingerprint and length has its
///   bytes compared (a seqlock read: the state word again after the bytes; a change
///   starts the claim again), and equal bytes answer "in use". Else it marks the first
///   free slot *pending* with one compare-and-exchange, writes the bytes, reads the window
///   again, and backs off (undoes its mark, starts again) if another slot holds a pending
///   mark with the same fingerprint and length (the same id claimed at the same moment by
///   another thread: of two, each marks before it reads again, with sequentially
///   consistent operations, so at least one sees the other), or answers "in use" if it
///   finds the id live. Then it goes live with one store. **An id is never live twice.**
/// - A release finds the id's live slot (only its call releases it, so it stays put) and
///   frees it with one store.
/// - A lookup reads the window (a pending slot is not live yet).
/// - The overflow: a `Set<String>` under a lock, for ids longer than `inlineBytes`, ids
///   whose window has no free slot, and claims that started again `attempts` times. An id
///   enters it only after its home's `overflowed` count was raised and, under the lock,
///   its window was read and holds neither a pending mark nor a live copy of it; a table
///   claim reads that count after its pending mark and, if it is not zero, looks in the
///   overflow under the lock before going live (the same mark-then-read pairing): so an id
///   is never live in the table and the overflow at once either. A claim through the
///   overflow that finds the id pending in the table waits for that claim to decide
///   (yielding, the lock released): this happens only when a table claim and an overflow
///   claim of the same short id overlap, which needs its window full or 64 restarts.
///
/// Cost: a claim reads the window's 16 state words (128 bytes) three times (look,
/// find a free slot, look again after the mark), compares the bytes of the slots with the
/// id's fingerprint and length (another id's only once in 2^32), and makes one
/// compare-and-exchange and one store; a release reads the window and makes one store;
/// with nothing in its home's overflow, no lock. Hashing the id: one pass over its bytes
/// (SipHash). Memory: 64 bytes a slot, `calloc`'d (only pages touched are resident); the
/// default 2^13 slots are 512 KiB. How often the overflow is used, by how full the table
/// is (the share of windows with no free slot, as simulated for `AddressCounts`, whose
/// windows are also 16): up to 2,048 live calls (a quarter of the default table) none;
/// 3,072, 0.03 %; 4,096, 0.4 %; 6,144, 12 %: past that a growing share of claims takes the
/// overflow's lock, which still answers exactly. Ids longer than 48 bytes always go
/// through it (the protocol allows 128; a UUID is 36).
///
/// Why this design: striping the set by hash still shares each stripe's lock between
/// all loops (a holder preempted on 2 cores stalls every call of its stripe); owning each
/// id in the shard its hash picks would make every invite one more step between loops
/// (a hop of latency before the callee rings) and every lookup of another shard's call
/// a step too, for a claim that is one compare-and-exchange here. A table of hashes
/// alone would answer `callIdInUse` or `notCallParticipant` for two ids that merely
/// collide: the bytes in the slot keep every answer exact, for 48 bytes a slot.
final class CallDirectory: @unchecked Sendable {
    /// Slots an id may live in, from its home.
    static let window = 16
    /// Bytes of an id held in a slot; longer ids live in the overflow.
    static let inlineBytes = 48
    /// Starts of a claim in the table before it goes through the overflow.
    static let attempts = 64
    /// Starts of a claim made at once; each later one first yields the CPU.
    static let quickAttempts = 8
    /// Words of id bytes a slot has.
    private static let byteWords = 6

    /// `calloc`'d words (zero: free slots with no overflow), used only through `Atomic`:
    /// `slotCount` state words, then `slotCount` `overflowed` counts, then `byteWords`
    /// words of bytes per slot.
    private let words: UnsafeMutablePointer<Atomic<UInt64>>
    private let slotCount: Int
    private let mask: Int
    /// The ids the table does not hold (see above).
    private let overflow = Mutex<Set<String>>([])

    /// `slotCount` a power of two, at least `window`.
    init(slotCount: Int = 1 << 13) {
        precondition(slotCount >= Self.window && slotCount & (slotCount - 1) == 0, "a power of two of at least a window")
        let count = slotCount * (2 + Self.byteWords)
        let memory = calloc(count, MemoryLayout<Atomic<UInt64>>.stride)!
        // An `Atomic<UInt64>` is laid out as its value: zeroed memory is a table of zeros.
        words = memory.bindMemory(to: Atomic<UInt64>.self, capacity: count)
        self.slotCount = slotCount
        mask = slotCount - 1
    }

    deinit { free(words) }

    // MARK: Slots

    private static let vacant: UInt64 = 0, pending: UInt64 = 1, live: UInt64 = 2
    private static let phaseMask: UInt64 = 0b11
    /// The id's length (bits 2-7) and fingerprint (bits 32-63): a free slot has length 0,
    /// which no id has.
    private static let identityMask: UInt64 = 0xFFFF_FFFF_0000_00FC
    private static let versionUnit: UInt64 = 1 << 8
    private static let versionMask: UInt64 = 0x0000_0000_FFFF_FF00

    /// Where slot `slot`'s state word, `overflowed` count and byte word `index` are in `words`.
    @inline(__always) private func state(_ slot: Int) -> Int { slot }
    @inline(__always) private func overflowed(_ slot: Int) -> Int { slotCount + slot }
    @inline(__always) private func byteWord(_ slot: Int, _ index: Int) -> Int { 2 * slotCount + slot * Self.byteWords + index }
    @inline(__always) private func slot(_ key: Key, _ offset: Int) -> Int { (key.home &+ offset) & mask }

    /// A state word's version moved on by one, with `phase` and `identity`.
    @inline(__always)
    private static func next(_ word: UInt64, _ phase: UInt64, _ identity: UInt64) -> UInt64 {
        ((word &+ versionUnit) & versionMask) | identity | phase
    }

    /// An id as the table sees it.
    private struct Key {
        var home: Int
        /// Length and fingerprint, placed as in a state word.
        var identity: UInt64
        /// Its bytes, little-endian, zero-padded (nil: longer than `inlineBytes`).
        var bytes: InlineArray<6, UInt64>?
        var wordCount: Int
    }

    private func makeKey(_ callID: String) -> Key {
        var hasher = Hasher()
        hasher.combine(callID)
        let hash = UInt64(bitPattern: Int64(hasher.finalize()))
        var id = callID
        return id.withUTF8 { utf8 -> Key in
            let identity = (hash & 0xFFFF_FFFF_0000_0000) | (UInt64(min(utf8.count, 63)) << 2)
            guard utf8.count <= Self.inlineBytes else {
                return Key(home: Int(truncatingIfNeeded: hash) & mask, identity: identity, bytes: nil, wordCount: 0)
            }
            var bytes = InlineArray<6, UInt64>(repeating: 0)
            for (index, byte) in utf8.enumerated() { bytes[index >> 3] |= UInt64(byte) << ((index & 7) * 8) }
            return Key(home: Int(truncatingIfNeeded: hash) & mask, identity: identity, bytes: bytes, wordCount: (utf8.count + 7) / 8)
        }
    }

    private enum Match { case same, different, changed }

    /// Whether live slot `slot`, whose state word was `word` (read with a sequentially
    /// consistent load, an acquire), holds `key`'s bytes: a seqlock read, checked by
    /// reading the state word again after the bytes.
    private func compare(_ slot: Int, _ word: UInt64, _ key: Key, _ bytes: InlineArray<6, UInt64>) -> Match {
        var equal = true
        for index in 0..<key.wordCount where words[byteWord(slot, index)].load(ordering: .relaxed) != bytes[index] { equal = false }
        // Orders the byte loads before the second read (Boehm's seqlock reader): bytes of
        // a later claim of this slot imply a changed state word.
        atomicMemoryFence(ordering: .acquiring)
        guard words[state(slot)].load(ordering: .relaxed) == word else { return .changed }
        return equal ? .same : .different
    }

    /// Where `key` is in the table: live (in which slot), pending (another claim of it, or
    /// of an id with its fingerprint and length, is undecided), absent, or unknown (a slot
    /// changed under the read: the caller reads again).
    private enum Presence { case live(slot: Int), pending, absent, changed }

    private func find(_ key: Key, _ bytes: InlineArray<6, UInt64>, skipping skipped: Int = -1) -> Presence {
        var result = Presence.absent
        for offset in 0..<Self.window {
            let index = slot(key, offset)
            guard index != skipped else { continue }
            let word = words[state(index)].load(ordering: .sequentiallyConsistent)
            guard word & Self.identityMask == key.identity else { continue }
            switch word & Self.phaseMask {
            case Self.pending: result = .pending
            case Self.live:
                switch compare(index, word, key, bytes) {
                case .same: return .live(slot: index)
                case .changed: return .changed
                case .different: break
                }
            default: break
            }
        }
        return result
    }

    // MARK: Operations

    /// Claims `callID` for a new call; false if a live call has it.
    func claim(_ callID: String) -> Bool {
        let key = makeKey(callID)
        guard let bytes = key.bytes else { return claimInOverflow(callID, key) }
        attempt: for attempt in 0..<Self.attempts {
            // Past a few quick retries, the thread that keeps its pending mark is likely
            // preempted: give it the CPU (a yield, not a wait).
            if attempt >= Self.quickAttempts { sched_yield() }
            switch find(key, bytes) {
            case .live: return false
            case .pending, .changed: continue attempt
            case .absent: break
            }
            var vacant: (index: Int, word: UInt64)?
            for offset in 0..<Self.window {
                let index = slot(key, offset)
                let word = words[state(index)].load(ordering: .sequentiallyConsistent)
                if word & Self.phaseMask == Self.vacant { vacant = (index, word); break }
            }
            guard let vacant else { break attempt }
            let mark = Self.next(vacant.word, Self.pending, key.identity)
            guard words[state(vacant.index)].compareExchange(expected: vacant.word, desired: mark, ordering: .sequentiallyConsistent).exchanged
            else { continue attempt }
            // The mark before the bytes, for a reader that compares them (Boehm's seqlock
            // writer); readers compare live slots only, and this one is pending.
            atomicMemoryFence(ordering: .releasing)
            for index in 0..<key.wordCount { words[byteWord(vacant.index, index)].store(bytes[index], ordering: .relaxed) }
            let undo = Self.next(mark, Self.vacant, 0)
            switch find(key, bytes, skipping: vacant.index) {
            case .live:
                words[state(vacant.index)].store(undo, ordering: .sequentiallyConsistent)
                return false
            case .pending, .changed:
                words[state(vacant.index)].store(undo, ordering: .sequentiallyConsistent)
                continue attempt
            case .absent: break
            }
            // An overflow claim of this id raises the count before it reads the window.
            if words[overflowed(key.home)].load(ordering: .sequentiallyConsistent) != 0,
               overflow.withLock(timing: .callDirectory, { $0.contains(callID) }) {
                words[state(vacant.index)].store(undo, ordering: .sequentiallyConsistent)
                return false
            }
            words[state(vacant.index)].store(Self.next(mark, Self.live, key.identity), ordering: .sequentiallyConsistent)
            return true
        }
        return claimInOverflow(callID, key)
    }

    /// Claims `callID` in the overflow (see the type's comment).
    private func claimInOverflow(_ callID: String, _ key: Key) -> Bool {
        words[overflowed(key.home)].wrappingAdd(1, ordering: .sequentiallyConsistent)
        while true {
            let decided: Bool? = overflow.withLock(timing: .callDirectory) { ids in
                if let bytes = key.bytes {
                    switch find(key, bytes) {
                    case .live: return false
                    case .pending, .changed: return nil
                    case .absent: break
                    }
                }
                return ids.insert(callID).inserted
            }
            if let decided {
                if !decided { words[overflowed(key.home)].wrappingSubtract(1, ordering: .sequentiallyConsistent) }
                return decided
            }
            // A table claim of this id is undecided: let it finish (it may need the lock).
            sched_yield()
        }
    }

    /// The call ended (or was never set up).
    func release(_ callID: String) {
        let key = makeKey(callID)
        if let bytes = key.bytes {
            while true {
                switch find(key, bytes) {
                case .live(let index):
                    // Only this call releases its id: the slot stays this id's until now.
                    let word = words[state(index)].load(ordering: .sequentiallyConsistent)
                    words[state(index)].store(Self.next(word, Self.vacant, 0), ordering: .sequentiallyConsistent)
                    return
                case .changed: continue
                case .pending, .absent: break
                }
                break
            }
        }
        let removed = overflow.withLock(timing: .callDirectory) { $0.remove(callID) != nil }
        if removed { words[overflowed(key.home)].wrappingSubtract(1, ordering: .sequentiallyConsistent) }
        assert(removed, "released call id \(callID) that was never claimed")
    }

    /// Whether a live call has `callID`.
    func contains(_ callID: String) -> Bool {
        let key = makeKey(callID)
        if let bytes = key.bytes {
            while true {
                switch find(key, bytes) {
                case .live: return true
                case .changed: continue
                case .pending, .absent: break
                }
                break
            }
        }
        guard words[overflowed(key.home)].load(ordering: .sequentiallyConsistent) != 0 else { return false }
        return overflow.withLock(timing: .callDirectory) { $0.contains(callID) }
    }

    /// Ids in the overflow now (tests, diagnostics).
    var overflowCount: Int { overflow.withLock { $0.count } }
}
