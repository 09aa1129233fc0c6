import Testing
@testable import SignalingProtocol

@Suite("Frame assembler")
struct FrameAssemblerTests {
    let stream = SampleFrames.all.flatMap { FrameEncoder.encode($0) }

    /// Feeds `stream` in chunks of `size` through `withInput`, taking at most `limit`
    /// frames per chunk (the rest must stay kept, in order).
    private func assembleBorrowing(chunk size: Int, framesPerRead limit: Int = .max) throws -> (frames: [Frame], left: Int) {
        var assembler = FrameAssembler(maxFrameLength: 1 << 20)
        var frames: [Frame] = []
        var offset = 0
        while offset < stream.count {
            let end = min(offset + size, stream.count)
            try stream[offset..<end].withUnsafeBytes { bytes in
                try assembler.withInput(bytes) { input in
                    var taken = 0
                    while taken < limit, let frame = try input.next() {
                        frames.append(frame)
                        taken += 1
                    }
                }
            }
            offset = end
        }
        // What was left for later comes out with an empty read.
        try assembler.withInput(UnsafeRawBufferPointer(start: nil, count: 0)) { input in
            while let frame = try input.next() { frames.append(frame) }
        }
        return (frames, assembler.bufferedCount)
    }

    @Test("a stream cut into reads of every size yields every frame once, in order (append and next)")
    func appendAndNext() throws {
        for size in [1, 2, 3, 5, 7, 64, 1000, stream.count] {
            var assembler = FrameAssembler(maxFrameLength: 1 << 20)
            var frames: [Frame] = []
            var offset = 0
            while offset < stream.count {
                let end = min(offset + size, stream.count)
                assembler.append(contentsOf: stream[offset..<end])
                frames += try assembler.drain()
                offset = end
            }
            #expect(frames == SampleFrames.all, "reads of \(size) bytes")
            #expect(assembler.bufferedCount == 0)
        }
    }

    @Test("frames decode straight out of a borrowed read, whatever the cut, and only the tail is kept")
    func borrowedReads() throws {
        for size in [1, 2, 3, 5, 7, 64, 1000, stream.count] {
            let (frames, left) = try assembleBorrowing(chunk: size)
            #expect(frames == SampleFrames.all, "reads of \(size) bytes")
            #expect(left == 0)
        }
        // Two whole frames and three bytes of a third: only the three bytes are kept.
        let two = FrameEncoder.encode(.ping) + FrameEncoder.encode(.pong)
        var assembler = FrameAssembler()
        let read = two + FrameEncoder.encode(.ping)[..<3]
        let frames = try read.withUnsafeBytes { bytes in
            try assembler.withInput(bytes) { input in [try input.next(), try input.next(), try input.next()] }
        }
        #expect(frames == [.ping, .pong, nil])
        #expect(assembler.bufferedCount == 3)
    }

    @Test("frames a reader did not take stay kept and come first, before later bytes")
    func framesNotTakenStay() throws {
        for size in [3, 64, stream.count] {
            let (frames, left) = try assembleBorrowing(chunk: size, framesPerRead: 1)
            #expect(frames == SampleFrames.all, "reads of \(size) bytes, one frame taken per read")
            #expect(left == 0)
        }
    }

    @Test("an oversize length is refused from its four bytes even when they arrive split")
    func oversizeAcrossReads() throws {
        var assembler = FrameAssembler(maxFrameLength: 1024)
        let first: [UInt8] = [0, 0]
        let second: [UInt8] = [4, 1]
        let none = try first.withUnsafeBytes { bytes in
            try assembler.withInput(bytes) { input in try input.next() }
        }
        #expect(none == nil)
        #expect(throws: ProtocolViolation.self) {
            try second.withUnsafeBytes { bytes in
                try assembler.withInput(bytes) { input in try input.next() }
            }
        }
        var appending = FrameAssembler(maxFrameLength: 1024)
        appending.append(contentsOf: first)
        #expect(try appending.next() == nil)
        appending.append(contentsOf: second)
        #expect(throws: ProtocolViolation.self) { try appending.next() }
    }

    @Test("bytes handed over with takeBuffered continue in the next assembler")
    func handOver() throws {
        let bytes = FrameEncoder.encode(.ping) + FrameEncoder.encode(.pong)
        var first = FrameAssembler()
        first.append(contentsOf: bytes[..<7])
        #expect(try first.next() == .ping)
        let rest = first.takeBuffered()
        #expect(rest == Array(bytes[5..<7]))
        #expect(first.bufferedCount == 0)
        var second = FrameAssembler(buffered: rest)
        second.append(contentsOf: bytes[7...])
        #expect(try second.drain() == [.pong])
    }

    @Test("a preamble before the frames is handed over whole, even split across reads")
    func preamble() throws {
        let preamble: [UInt8] = Array("HEADER!".utf8)
        let bytes = preamble + FrameEncoder.encode(.ping)
        var assembler = FrameAssembler()
        var preambleDone = false
        var frames: [Frame] = []
        for cut in [(0, 3), (3, 9), (9, bytes.count)] {
            try bytes[cut.0..<cut.1].withUnsafeBytes { read in
                try assembler.withInput(read) { input in
                    if !preambleDone {
                        let used = input.takePreamble { available in
                            available.starts(with: preamble) ? preamble.count : 0
                        }
                        if used == 0 { return }
                        preambleDone = true
                    }
                    while let frame = try input.next() { frames.append(frame) }
                }
            }
        }
        #expect(preambleDone)
        #expect(frames == [.ping])
        #expect(assembler.bufferedCount == 0)
    }

    @Test("discardRest keeps nothing")
    func discard() throws {
        var assembler = FrameAssembler()
        let bytes = FrameEncoder.encode(.ping) + [0, 0]
        bytes.withUnsafeBytes { read in
            assembler.withInput(read) { input in input.discardRest() }
        }
        #expect(assembler.bufferedCount == 0)
    }
}
