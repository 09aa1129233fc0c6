/// Reassembles length-prefixed frames from a byte stream that splits or joins them
/// anywhere: bytes in, whole frames (or the stream's framing error) out. The one copy of
/// stream reassembly: the server's input, the client library, voipload, connect-cycles and
/// the test clients all read through it; `FrameDecoder` parses one frame, this keeps what
/// is not a whole frame yet.
///
/// Two ways in:
/// - `append` + `next()`: the assembler owns a copy of every byte (simple readers).
/// - `withInput(_:_:)`: frames are decoded straight out of the caller's buffer (a loop's
///   shared read buffer); only what is still incomplete when the body returns (a
///   trailing partial frame, or frames the body chose not to take) is copied in. A
///   kept partial frame is completed by copying exactly its missing bytes.
///
/// Cost: every byte is copied into the buffer at most once. Consumed bytes are dropped by
/// moving the live rest down only once the consumed prefix is at least as long as the
/// rest, so bytes moved never exceed bytes consumed: amortised O(bytes) over the stream,
/// never quadratic shifting. The buffer holds only bytes that arrived: a length from the
/// wire is checked against `maxFrameLength` before anything else and never reserves
/// memory. An emptied buffer is released, so an idle stream holds no allocation.
///
/// After a framing error the stream cannot be resynchronised: callers close it.
public struct FrameAssembler: Sendable {
    /// Parses each frame; its `maxFrameLength` bounds what the stream may announce.
    public let decoder: FrameDecoder
    /// Bytes received and not yet handed out as frames start at `start`.
    private var buffer: [UInt8]
    private var start: Int

    /// `buffered`: bytes already read off the stream (e.g. what a handshake read past its
    /// reply); they come before anything appended later.
    public init(decoder: FrameDecoder, buffered: [UInt8] = []) {
        self.decoder = decoder
        self.buffer = buffered
        self.start = 0
    }

    public init(maxFrameLength: Int = ProtocolLimits.defaultMaxFrameLength, from sender: FrameSender? = nil, buffered: [UInt8] = []) {
        self.init(decoder: FrameDecoder(maxFrameLength: maxFrameLength, from: sender), buffered: buffered)
    }

    /// Bytes received that are not a returned frame yet.
    public var bufferedCount: Int { buffer.count - start }

    /// Copies `bytes` in, after what is buffered.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        compactBeforeGrowing()
        buffer.append(contentsOf: bytes)
    }

    /// Copies `bytes` in, after what is buffered.
    public mutating func append(contentsOf bytes: some Collection<UInt8>) {
        guard !bytes.isEmpty else { return }
        compactBeforeGrowing()
        buffer.append(contentsOf: bytes)
    }

    /// The next whole frame buffered; nil until one is complete.
    public mutating func next() throws(ProtocolViolation) -> Frame? {
        guard start < buffer.count else { return nil }
        guard let (frame, size) = try decoder.decode(buffer, start..<buffer.count) else { return nil }
        consume(size)
        return frame
    }

    /// Every whole frame buffered, in order.
    public mutating func drain() throws(ProtocolViolation) -> [Frame] {
        var frames: [Frame] = []
        while let frame = try next() { frames.append(frame) }
        return frames
    }

    /// Every whole frame of the buffered bytes followed by `bytes`, in order, decoded where
    /// `bytes` lie; the incomplete tail is kept (copied).
    public mutating func drain(_ bytes: UnsafeRawBufferPointer) throws(ProtocolViolation) -> [Frame] {
        try withInput(bytes) { input throws(ProtocolViolation) in
            var frames: [Frame] = []
            while let frame = try input.next() { frames.append(frame) }
            return frames
        }
    }

    /// Hands over the bytes not returned as frames (the assembler is empty afterwards):
    /// what a reader keeps between reads when it stores bytes rather than an assembler,
    /// or hands to the next reader of the stream.
    public mutating func takeBuffered() -> [UInt8] {
        defer { (buffer, start) = ([], 0) }
        return start == 0 ? buffer : Array(buffer[start...])
    }

    /// Runs `body` with the frames of the buffered bytes followed by `bytes`, decoding
    /// whole frames in `bytes` where they lie. What `body` leaves (unless it calls
    /// `Input.discardRest()`) is kept, copied once.
    public mutating func withInput<Value, Failure: Error>(
        _ bytes: UnsafeRawBufferPointer, _ body: (inout Input) throws(Failure) -> Value
    ) throws(Failure) -> Value {
        var input = Input(decoder: decoder, kept: buffer, keptStart: start, bytes: bytes)
        (buffer, start) = ([], 0)  // the input owns the kept bytes now (no copy on write)
        defer {
            if !input.discarded {
                (buffer, start) = (input.kept, input.keptStart)
                append(UnsafeRawBufferPointer(rebasing: bytes[input.offset...]))
                if start == buffer.count { (buffer, start) = ([], 0) }
            }
        }
        return try body(&input)
    }

    /// The frames of kept bytes followed by a borrowed buffer (`FrameAssembler.withInput`).
    public struct Input {
        let decoder: FrameDecoder
        var kept: [UInt8]
        var keptStart: Int
        let bytes: UnsafeRawBufferPointer
        /// Bytes of `bytes` used (copied into `kept` or returned as frames).
        var offset = 0
        var discarded = false

        /// Whether any byte is left, kept or borrowed (a whole frame or not).
        public var hasUnusedBytes: Bool { keptStart < kept.count || offset < bytes.count }

        /// The next whole frame; nil once the rest is incomplete.
        public mutating func next() throws(ProtocolViolation) -> Frame? {
            if keptStart < kept.count {
                return try nextFromKept()
            }
            guard offset < bytes.count,
                  let (frame, size) = try decoder.decode(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            else { return nil }
            offset += size
            return frame
        }

        /// A frame begun in `kept`: completes it with exactly its missing bytes first.
        private mutating func nextFromKept() throws(ProtocolViolation) -> Frame? {
            let prefix = ProtocolLimits.lengthPrefixSize
            if kept.count - keptStart < prefix && !takeIntoKept(prefix - (kept.count - keptStart)) { return nil }
            let size = try kept.withUnsafeBytes { bytes in
                Result { () throws(ProtocolViolation) in try decoder.frameSize(UnsafeRawBufferPointer(rebasing: bytes[keptStart...]))! }
            }.get()
            if kept.count - keptStart < size && !takeIntoKept(size - (kept.count - keptStart)) { return nil }
            let (frame, _) = try decoder.decode(kept, keptStart..<(keptStart + size))!
            keptStart += size
            if keptStart == kept.count { (kept, keptStart) = ([], 0) }
            return frame
        }

        /// Copies up to `count` bytes of `bytes` into `kept`; true if there were `count`.
        private mutating func takeIntoKept(_ count: Int) -> Bool {
            let taken = min(count, bytes.count - offset)
            kept.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + taken)]))
            offset += taken
            return taken == count
        }

        /// Hands every unused byte, contiguous, to `body`, which returns how many it used
        /// (a preamble before the frames, such as a PROXY header). Copies the borrowed
        /// bytes in first if bytes are kept: a preamble comes once per stream.
        public mutating func takePreamble(_ body: (UnsafeRawBufferPointer) -> Int) -> Int {
            if keptStart < kept.count {
                _ = takeIntoKept(bytes.count - offset)
                let keptStart = self.keptStart
                let used = kept.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[keptStart...])) }
                self.keptStart += used
                if self.keptStart == kept.count { (kept, self.keptStart) = ([], 0) }
                return used
            }
            let used = body(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            offset += used
            return used
        }

        /// Keeps nothing: the stream is being closed.
        public mutating func discardRest() { discarded = true }
    }

    private mutating func consume(_ count: Int) {
        start += count
        if start == buffer.count { (buffer, start) = ([], 0) }
    }

    /// Moves the live bytes down once the consumed prefix is at least as long as they are,
    /// so each move is paid for by the bytes consumed before it.
    private mutating func compactBeforeGrowing() {
        guard start > 0, start >= buffer.count - start else { return }
        buffer.removeSubrange(0..<start)
        start = 0
    }
}

extension FrameDecoder {
    /// Decodes the frame at the start of `array[range]` (nil while incomplete).
    fileprivate func decode(_ array: [UInt8], _ range: Range<Int>) throws(ProtocolViolation) -> (frame: Frame, size: Int)? {
        try array.withUnsafeBytes { bytes in
            Result { () throws(ProtocolViolation) in try decode(UnsafeRawBufferPointer(rebasing: bytes[range])) }
        }.get()
    }
}
