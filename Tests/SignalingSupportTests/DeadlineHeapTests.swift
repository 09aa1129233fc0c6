import Testing
@testable import SignalingSupport

@Suite("Deadline heap")
struct DeadlineHeapTests {
    @Test("entries come out in deadline order, whatever the order they went in")
    func order() {
        var heap = DeadlineHeap<UInt32, Int, Void>()
        var generator = SystemRandomNumberGenerator()
        let deadlines = (0..<2_000).map { _ in UInt32.random(in: 0..<500, using: &generator) }
        for (key, deadline) in deadlines.enumerated() { heap.insert(.init(deadline: deadline, key: key, stamp: ())) }
        var out: [UInt32] = []
        while let entry = heap.popFirst() { out.append(entry.deadline) }
        #expect(out == deadlines.sorted())
    }

    @Test("a heap emptied after a burst gives its storage back, a chunk at a time")
    func shrinksAfterBurst() {
        var heap = DeadlineHeap<UInt32, Int, Void>()
        for key in 0..<20_000 { heap.insert(.init(deadline: UInt32(key), key: key, stamp: ())) }
        #expect(heap.storage.chunks.count == 5)
        while heap.count > 100 { heap.popFirst() }
        #expect(heap.storage.chunks.count <= 2, "the first chunk and at most one spare")
        #expect(heap.first?.deadline == 19_900)
        #expect(heap.entries.count == 100)
    }
}
