/// A first-in first-out queue with amortised O(1) push and pop. Used for deadlines that
/// all have the same length (ring timeout, call grace, session TTL): with a constant
/// length, insertion order is deadline order, so no heap is needed.
struct FIFOQueue<Element> {
    private var storage: [Element] = []
    private var head = 0

    var isEmpty: Bool { head == storage.count }
    var count: Int { storage.count - head }
    var first: Element? { isEmpty ? nil : storage[head] }

    mutating func push(_ element: Element) { storage.append(element) }

    @discardableResult
    mutating func pop() -> Element? {
        guard !isEmpty else { return nil }
        let element = storage[head]
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.capacity <= 1024)
            head = 0
        } else if head >= 1024 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }
}
