import Testing
@testable import SignalingSupport

@Suite("Chunked array")
struct ChunkedArrayTests {
    @Test("appends, removals, writes and swaps across chunk boundaries agree with an array")
    func agreesWithArray() {
        var chunked = ChunkedArray<Int>()
        var model: [Int] = []
        var generator = FastRandom(seed: (3, 5, 7, 9))
        let chunk = ChunkedArray<Int>.chunkCapacity
        var largest = 0
        for step in 0..<60_000 {
            // Mostly appends for the first half, mostly removals after: the count crosses
            // several chunk boundaries both ways.
            let roll = Int(generator.next() % 10)
            if model.isEmpty || (step < 30_000 ? roll < 7 : roll < 2) {
                chunked.append(step)
                model.append(step)
            } else if roll == 9 {
                let first = Int(generator.next() % UInt64(model.count)), second = Int(generator.next() % UInt64(model.count))
                chunked.swapAt(first, second)
                model.swapAt(first, second)
            } else if roll == 8 {
                let index = Int(generator.next() % UInt64(model.count))
                chunked[index] = -step
                model[index] = -step
            } else {
                #expect(chunked.removeLast() == model.removeLast())
            }
            largest = max(largest, model.count)
            #expect(chunked.count == model.count)
            #expect(chunked.first == model.first)
            #expect(chunked.chunks.count <= (model.count + chunk - 1) / chunk + 1, "at most one spare chunk")
        }
        #expect(chunked.elements == model)
        #expect(largest > 3 * chunk && model.count < largest - 2 * chunk, "the test must cross chunk boundaries both ways")
    }

    @Test("a chunk boundary crossed back and forth keeps its spare chunk, and no chunk after the first grows its buffer")
    func spareChunkAtBoundary() {
        var chunked = ChunkedArray<Int>()
        let chunk = ChunkedArray<Int>.chunkCapacity
        for value in 0..<chunk { chunked.append(value) }
        #expect(chunked.chunks.count == 1)
        chunked.append(chunk)
        #expect(chunked.chunks.count == 2 && chunked.chunks[1].capacity >= chunk, "a chunk's room at once")
        let buffer = chunked.chunks[1].withUnsafeBufferPointer { $0.baseAddress }
        for _ in 0..<10 {
            chunked.removeLast()
            #expect(chunked.chunks.count == 2, "the emptied chunk stays as the spare")
            chunked.append(0)
        }
        #expect(chunked.chunks[1].withUnsafeBufferPointer { $0.baseAddress } == buffer, "the spare was reused, not reallocated")
        chunked.removeLast()
        chunked.removeLast()
        #expect(chunked.chunks.count == 2)
        while chunked.count > 0 { chunked.removeLast() }
        #expect(chunked.chunks.count == 1 && chunked.first == nil)
    }
}
