/// A certificate pin: the SHA-256 of a certificate's SubjectPublicKeyInfo, as
/// `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum` prints it.
/// Pinning the key rather than the certificate survives a renewal that keeps the key.
public struct PublicKeyPin: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The 32 bytes of the digest.
    public let digest: [UInt8]

    /// Nil unless `digest` is 32 bytes.
    public init?(digest: [UInt8]) {
        guard digest.count == 32 else { return nil }
        self.digest = digest
    }

    /// From 64 hex digits (either case); nil for anything else.
    public init?(hex: String) {
        let digits = Array(hex.utf8)
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let high = Self.value(of: digits[index]), let low = Self.value(of: digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        digest = bytes
    }

    /// Lower-case hex.
    public var description: String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: digest.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0x0F)]] }, as: UTF8.self)
    }

    /// Coded as its hex text.
    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let pin = PublicKeyPin(hex: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a SHA-256 in hex: \(text)"))
        }
        self = pin
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    private static func value(of digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return digit - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

extension TLSConnection {
    /// The pin check after a verified handshake: nil when `pins` is empty or the peer's
    /// public key matches one of them (any-of, so the next key can be pinned ahead of a
    /// rotation); otherwise the key the peer presented (nil digest: no certificate).
    public func pinMismatch(against pins: [PublicKeyPin]) -> PinMismatch? {
        guard !pins.isEmpty else { return nil }
        guard let presented = peerPublicKeySHA256.flatMap(PublicKeyPin.init(digest:)) else { return PinMismatch(presented: nil) }
        return pins.contains(presented) ? nil : PinMismatch(presented: presented)
    }
}

/// A certificate whose public key matches none of the pins.
public struct PinMismatch: Sendable, Equatable, CustomStringConvertible {
    /// What the server presented; nil when it sent no certificate.
    public let presented: PublicKeyPin?

    public var description: String {
        presented.map { "the server's public key \($0) matches no pin" } ?? "the server presented no certificate to pin"
    }
}
