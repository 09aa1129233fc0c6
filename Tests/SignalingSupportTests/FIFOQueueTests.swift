import Testing
@testable import SignalingSupport

@Suite("First-in first-out queue in chunks")
struct FIFOQueueTests {
    @Test("random pushes and pops across many chunks agree with an array, first and forEach included")
    func agreesWithArray() {
        var queue = FIFOQueue<Int>()
        var model: [Int] = []
        var modelHead = 0
        var generator = FastRandom(seed: (3, 1, 4, 1))
        var next = 0
        var mostChunks = 0
        for step in 0..<200_000 {
            // Bursts: mostly pushes for a while, then mostly pops, so the queue crosses
            // chunks and empties now and then.
            let pushing = (step / 5_000) % 2 == 0 ? generator.next() % 4 != 0 : generator.next() % 4 == 0
            if pushing {
                queue.push(next)
                model.append(next)
                next += 1
            } else {
                let expected = modelHead < model.count ? model[modelHead] : nil
                if expected != nil { modelHead += 1 }
                #expect(queue.pop() == expected)
            }
            #expect(queue.count == model.count - modelHead)
            #expect(queue.first == (modelHead < model.count ? model[modelHead] : nil))
            mostChunks = max(mostChunks, queue.liveChunks)
            if step % 9_973 == 0 {
                var seen: [Int] = []
                queue.forEach { seen.append($0) }
                #expect(seen == Array(model[modelHead...]))
            }
        }
        #expect(mostChunks >= 3, "the test must cross chunks")
        while let element = queue.pop() {
            #expect(element == model[modelHead])
            modelHead += 1
        }
        #expect(modelHead == model.count && queue.isEmpty && queue.liveChunks == 0)
    }

    @Test("read-out chunks are dropped: a queue holds about its live elements' chunks")
    func readOutChunksAreDropped() {
        var queue = FIFOQueue<Int>()
        let chunk = FIFOQueue<Int>.chunkCapacity
        for number in 0..<(10 * chunk) { queue.push(number) }
        #expect(queue.liveChunks == 10)
        // A steady state: one push and one pop, for a hundred chunks' worth.
        for number in 0..<(100 * chunk) {
            queue.push(number)
            #expect(queue.pop() != nil)
        }
        #expect(queue.count == 10 * chunk)
        #expect(queue.liveChunks <= 11)
    }
}
