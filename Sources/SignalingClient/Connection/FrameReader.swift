import SignalingProtocol

/// Reassembles frames from a byte stream (the codec does the parsing).
struct FrameReader {
    let decoder: FrameDecoder
    private var buffer: [UInt8]

    init(maxFrameLength: Int, pending: [UInt8]) {
        decoder = FrameDecoder(maxFrameLength: maxFrameLength)
        buffer = pending
    }

    mutating func append(_ bytes: ArraySlice<UInt8>) { buffer.append(contentsOf: bytes) }

    /// Every complete frame buffered so far; keeps the incomplete tail.
    mutating func drain() -> Result<[Frame], ProtocolViolation> {
        let decoder = self.decoder
        let result = buffer.withUnsafeBytes { bytes -> Result<([Frame], Int), ProtocolViolation> in
            do throws(ProtocolViolation) {
                let decoded = try decoder.decodeAll(bytes)
                return .success((decoded.frames, decoded.consumed))
            } catch {
                return .failure(error)
            }
        }
        switch result {
        case .success(let (frames, consumed)):
            if consumed > 0 { buffer.removeFirst(consumed) }
            return .success(frames)
        case .failure(let violation):
            return .failure(violation)
        }
    }
}
