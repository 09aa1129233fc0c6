/// A first-in first-out queue whose push and pop never copy more than one chunk. Used for
/// deadlines that all have the same length (ring timeout, call grace, handshake timeout,
/// message ids' dedup window): with a constant length, insertion order is deadline order,
/// so no heap is needed; and for steps waiting to run.
///
/// Elements live in chunks of at most `chunkCapacity` (1,024): pushes append to the last
/// chunk, pops read the first one from `head` on and drop it once it is read out; a queue
/// that fits in one chunk is one array, as it always was. A flat array grown by doubling,
/// with the popped front cut off when it was half of it (until 4 December 2026), copied
/// the whole queue in one push or one pop: at the million message ids of the dedup window,
/// 19-23 ms in the push that outgrew it and 46-52 ms in the pop that cut half a million
/// off, on the loop holding the shard (docs/LOAD-TESTING.md, "Tables that grow a few slots
/// at a time").
///
/// Cost: push and pop O(1); at most a chunk's elements copied by a push (the first chunk
/// grows like an array), and the chunk list's references moved once per 64 chunks read
/// out. Memory: the live elements, those already read from the first chunk (up to a chunk,
/// dropped with it), the last chunk's room, and a reference per chunk. An emptied queue
/// keeps its buffer (at most a chunk) for the next pushes.
public struct FIFOQueue<Element> {
    /// The chunk pops read, from `head` on: the only chunk while the queue fits in one (no
    /// more allocations than a flat array), and then the one that takes pushes too.
    @usableFromInline var front: [Element] = []
    @usableFromInline var head = 0
    /// The chunks after `front`, from `laterHead` on (those before are read out and
    /// empty); the last takes pushes, and every chunk before it is full.
    @usableFromInline var later: [[Element]] = []
    @usableFromInline var laterHead = 0
    @usableFromInline var storedCount = 0

    /// Elements per chunk.
    @inlinable public static var chunkCapacity: Int { 1024 }

    // Inlinable, so that the loops' and the routing core's queues are specialised for
    // their elements: unspecialised, every push and pop copied its element through value
    // witnesses (`Switchboard.drive`'s queue of steps, per operation).
    @inlinable public init() {}

    @inlinable public var count: Int { storedCount }
    @inlinable public var isEmpty: Bool { storedCount == 0 }
    @inlinable public var first: Element? { storedCount == 0 ? nil : front[head] }

    @inlinable
    public mutating func push(_ element: Element) {
        storedCount += 1
        if laterHead == later.count {
            if front.count < Self.chunkCapacity { return front.append(element) }
        } else if later[later.count - 1].count < Self.chunkCapacity {
            return later[later.count - 1].append(element)
        }
        // The last chunk is full: a new one, made whole at once (`front` grows like an array,
        // so a queue that stays small stays small).
        var chunk: [Element] = []
        chunk.reserveCapacity(Self.chunkCapacity)
        chunk.append(element)
        later.append(chunk)
    }

    @inlinable @discardableResult
    public mutating func pop() -> Element? {
        guard storedCount > 0 else { return nil }
        let element = front[head]
        head += 1
        storedCount -= 1
        if storedCount == 0 {
            // Everything is read: keep the buffer for the next pushes.
            front.removeAll(keepingCapacity: true)
            head = 0
            if !later.isEmpty {
                later.removeAll()
                laterHead = 0
            }
        } else if head == front.count {
            // Read out (elements remain, so a later chunk holds them): its memory goes now.
            swap(&front, &later[laterHead])
            later[laterHead] = []
            laterHead += 1
            head = 0
            if laterHead == later.count {
                later.removeAll(keepingCapacity: true)
                laterHead = 0
            } else if laterHead >= 64 && laterHead * 2 >= later.count {
                later.removeFirst(laterHead)
                laterHead = 0
            }
        }
        return element
    }

    /// Hands `body` every element, the first first.
    @inlinable
    public func forEach(_ body: (Element) throws -> Void) rethrows {
        guard storedCount > 0 else { return }
        for element in front[head...] { try body(element) }
        for index in laterHead..<later.count {
            for element in later[index] { try body(element) }
        }
    }

    /// Chunks holding elements (for tests).
    var liveChunks: Int { count == 0 ? 0 : 1 + later.count - laterHead }
}

extension FIFOQueue: Sendable where Element: Sendable {}
