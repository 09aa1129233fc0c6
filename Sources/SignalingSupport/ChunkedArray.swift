/// An array that grows and shrinks at its end a chunk at a time and never copies its
/// elements to do so: the storage of `DeadlineHeap`, whose flat array copied every entry in
/// the append that outgrew it (16 bytes an entry: 16 MB at the million devices of a shard's
/// expiry heap, milliseconds of a loop's hold) and again in the pop that shrank it.
///
/// Elements live in chunks of `chunkCapacity` (4,096); element `i` is element
/// `i % chunkCapacity` of chunk `i / chunkCapacity`. The first chunk grows as an array
/// does; an append to a full last chunk starts a new chunk (one allocation of a chunk's
/// room), a removal that empties the last chunk frees
/// the one after it if there is one (one spare is kept, so that appends and removals at a
/// chunk boundary do not allocate and free by turns).
///
/// Cost: an index into the chunk list and one into the chunk per access; append and
/// removal O(1), the chunk list's references copied when it grows (one per 4,096
/// elements). Memory: the elements, the last chunk's room and at most one spare chunk.
/// (`IncrementalHashTable`'s `SlotSegments` splits a fixed-size table the same way, with
/// what a hash table needs on top: segments shared until written, freed behind a drain.)
public struct ChunkedArray<Element> {
    /// Every chunk before the last holding elements is full; a spare empty chunk may follow.
    @usableFromInline var chunks: [[Element]] = []
    @usableFromInline var storedCount = 0

    /// Elements per chunk.
    @inlinable public static var chunkShift: Int { 12 }
    @inlinable public static var chunkCapacity: Int { 1 << chunkShift }

    // Inlinable, so that the heaps of other modules are specialised for their entries.
    @inlinable public init() {}

    @inlinable public var count: Int { storedCount }
    @inlinable public var isEmpty: Bool { storedCount == 0 }
    @inlinable public var first: Element? { storedCount == 0 ? nil : chunks[0][0] }

    /// An index outside `0..<count` traps in the chunk list's or the chunk's own bounds
    /// check (every chunk holds exactly its elements; a negative index is a negative chunk).
    @inlinable
    public subscript(index: Int) -> Element {
        get { chunks[index &>> Self.chunkShift][index & (Self.chunkCapacity - 1)] }
        set { chunks[index &>> Self.chunkShift][index & (Self.chunkCapacity - 1)] = newValue }
    }

    @inlinable
    public mutating func append(_ element: Element) {
        let chunk = storedCount &>> Self.chunkShift
        if chunk == chunks.count {
            // The first chunk grows as an array does (a small heap stays small); the others
            // take their whole room at once, so that no append copies more than a chunk.
            var fresh: [Element] = []
            if chunk > 0 { fresh.reserveCapacity(Self.chunkCapacity) }
            chunks.append(fresh)
        }
        chunks[chunk].append(element)
        storedCount += 1
    }

    @inlinable
    @discardableResult
    public mutating func removeLast() -> Element {
        precondition(storedCount > 0, "removeLast of an empty ChunkedArray")
        storedCount -= 1
        let chunk = storedCount &>> Self.chunkShift
        let element = chunks[chunk].removeLast()
        // Emptied: the spare after it (if any) goes, this one stays as the spare.
        if chunks[chunk].isEmpty && chunks.count > chunk + 1 { chunks.removeLast() }
        return element
    }

    @inlinable
    public mutating func swapAt(_ first: Int, _ second: Int) {
        guard first != second else { return }
        let kept = self[first]
        self[first] = self[second]
        self[second] = kept
    }

    @inlinable
    public mutating func removeAll() {
        chunks = []
        storedCount = 0
    }

    /// Every element, in order (a copy).
    @inlinable public var elements: [Element] {
        var all: [Element] = []
        all.reserveCapacity(storedCount)
        for chunk in chunks { all.append(contentsOf: chunk) }
        return all
    }
}
