/// A 128-bit session identifier chosen by the server, opaque to clients.
public struct SessionID: Hashable, Sendable, CustomStringConvertible {
    public var high: UInt64
    public var low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// A fresh random identifier.
    public static func random() -> SessionID {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }

    public static func random(using generator: inout some RandomNumberGenerator) -> SessionID {
        SessionID(high: generator.next(), low: generator.next())
    }

    /// 32 lowercase hex digits.
    public var description: String {
        hex(high) + hex(low)
    }

    /// Parses the 32-hex-digit form produced by `description`.
    public init?(hexString: String) {
        let utf8 = Array(hexString.utf8)
        guard utf8.count == 32,
              let high = UInt64(String(decoding: utf8[0..<16], as: UTF8.self), radix: 16),
              let low = UInt64(String(decoding: utf8[16..<32], as: UTF8.self), radix: 16)
        else { return nil }
        self.init(high: high, low: low)
    }

    private func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
