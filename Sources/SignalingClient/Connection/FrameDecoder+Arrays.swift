import SignalingProtocol

extension FrameDecoder {
    /// Decodes the frame at the start of `bytes` (nil while incomplete).
    func decode(array bytes: [UInt8]) -> Result<(frame: Frame, size: Int)?, ProtocolViolation> {
        bytes.withUnsafeBytes { raw in
            do throws(ProtocolViolation) {
                return .success(try decode(raw))
            } catch {
                return .failure(error)
            }
        }
    }
}
