/// A first-in first-out queue with amortised O(1) push and pop. Used for deadlines that
/// all have the same length (ring timeout, call grace, handshake timeout): with a constant
/// length, insertion order is deadline order, so no heap is needed.
///
/// Memory: the storage holds at most about twice the elements queued (popped elements
/// are dropped from the front once they are half of it), and a buffer left mostly empty
/// after a burst is replaced by a smaller one.
public struct FIFOQueue<Element> {
    private var storage: [Element] = []
    private var head = 0

    public init() {}

    public var isEmpty: Bool { head == storage.count }
    public var count: Int { storage.count - head }
    public var first: Element? { isEmpty ? nil : storage[head] }

    public mutating func push(_ element: Element) { storage.append(element) }

    @discardableResult
    public mutating func pop() -> Element? {
        guard !isEmpty else { return nil }
        let element = storage[head]
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.capacity <= 1024)
            head = 0
        } else if head >= 1024 && head * 2 >= storage.count {
            let remaining = storage.count - head
            if storage.capacity > 4096 && remaining * 4 < storage.capacity {
                // Mostly empty after a burst: move what is left to a smaller buffer, so
                // that a queue that never drains completely gives the burst's memory back.
                var smaller: [Element] = []
                smaller.reserveCapacity(remaining * 2)
                smaller.append(contentsOf: storage[head...])
                storage = smaller
            } else {
                storage.removeFirst(head)
            }
            head = 0
        }
        return element
    }

    /// Hands `body` every element, the first first.
    public func forEach(_ body: (Element) throws -> Void) rethrows {
        for element in storage[head...] { try body(element) }
    }
}

extension FIFOQueue: Sendable where Element: Sendable {}
