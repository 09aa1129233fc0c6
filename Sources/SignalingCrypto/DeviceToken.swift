/// What a device token asserts (docs/AUTH.md): who may connect, from which device, until when.
public struct DeviceTokenClaims: Equatable, Sendable {
    /// The HELLO `userId` the token is for.
    public var userID: String
    /// The HELLO `deviceId` the token is for; nil: any device of the user.
    public var deviceID: String?
    /// Unix time in seconds at which the token stops being accepted: a handshake is
    /// accepted while `now < expiresAt`.
    public var expiresAt: Int64

    public init(userID: String, deviceID: String?, expiresAt: Int64) {
        self.userID = userID
        self.deviceID = deviceID
        self.expiresAt = expiresAt
    }
}

/// The version 1 device token (docs/AUTH.md is the specification; its test vectors are
/// checked against this code):
///
///     token   = "v1." kid "." payload "." mac
///     payload = base64url(user LF device LF exp)          device empty = any device
///     mac     = base64url(HMAC-SHA256(secret, "v1." kid "." payload))
///
/// base64url without padding; `exp` in decimal Unix seconds. The MAC covers the text
/// before the last dot, so the version and the key id are signed too.
public enum DeviceToken {
    /// The first field of every version 1 token, with its dot.
    public static let prefix = Array("v1.".utf8)
    /// Key ids: 1 to 64 characters from A-Z a-z 0-9 - _ (no dot, no space).
    public static let maximumKeyIDLength = 64
    /// User and device ids: at most 128 bytes of UTF-8, no control characters (PROTOCOL.md 2).
    public static let maximumIDLength = 128

    /// The token for `claims`, signed with `key`.
    public static func mint(_ claims: DeviceTokenClaims, key: TokenKey) throws(CryptoError) -> String {
        try mint(claims, keyID: key.id, key: HMACSHA256.Key(key.secret))
    }

    public static func mint(_ claims: DeviceTokenClaims, keyID: String, key: HMACSHA256.Key) throws(CryptoError) -> String {
        guard isValidKeyID(keyID) else { throw CryptoError("key id '\(keyID)' must be 1-64 characters from A-Z a-z 0-9 - _") }
        guard isValidID(claims.userID, allowEmpty: false) else {
            throw CryptoError("the user id must be 1-128 bytes with no control characters")
        }
        guard isValidID(claims.deviceID ?? "", allowEmpty: true), claims.deviceID != "" else {
            throw CryptoError("the device id must be 1-128 bytes with no control characters")
        }
        guard claims.expiresAt >= 0 else { throw CryptoError("the expiry must not be before 1970") }
        let payload = Array(claims.userID.utf8) + [0x0a] + Array((claims.deviceID ?? "").utf8) + [0x0a]
            + Array(String(claims.expiresAt).utf8)
        let signed = "v1.\(keyID).\(Base64URL.encode(payload))"
        return signed + "." + Base64URL.encode(try key.authenticate(Array(signed.utf8)))
    }

    /// A token cut at its dots, not verified.
    public struct Parts: Sendable {
        public var keyID: String
        /// The text the MAC covers: everything before the last dot.
        public var signed: ArraySlice<UInt8>
        /// The encoded payload and the decoded MAC (nil: not base64url, or not 32 bytes).
        public var payload: ArraySlice<UInt8>
        public var mac: [UInt8]?
    }

    /// Nil unless `token` is `v1.` and three more dot-separated fields with a valid key id.
    public static func split(_ token: [UInt8]) -> Parts? {
        guard token.starts(with: prefix) else { return nil }
        let fields = token.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard fields.count == 4 else { return nil }
        let keyID = String(decoding: fields[1], as: UTF8.self)
        guard isValidKeyID(keyID) else { return nil }
        let mac = Base64URL.decode(fields[3]).flatMap { $0.count == HMACSHA256.length ? $0 : nil }
        return Parts(keyID: keyID, signed: token[..<fields[3].startIndex].dropLast(), payload: fields[2], mac: mac)
    }

    /// The claims of an encoded payload; nil if it breaks the format.
    public static func claims(ofPayload encoded: some Collection<UInt8>) -> DeviceTokenClaims? {
        guard let payload = Base64URL.decode(encoded) else { return nil }
        let lines = payload.split(separator: 0x0a, omittingEmptySubsequences: false)
        guard lines.count == 3 else { return nil }
        guard let user = String(validating: lines[0], as: UTF8.self), isValidID(user, allowEmpty: false),
              let device = String(validating: lines[1], as: UTF8.self), isValidID(device, allowEmpty: true),
              let expiresAt = parseSeconds(lines[2])
        else { return nil }
        return DeviceTokenClaims(userID: user, deviceID: device.isEmpty ? nil : device, expiresAt: expiresAt)
    }

    public static func isValidKeyID(_ keyID: String) -> Bool {
        let bytes = Array(keyID.utf8)
        return (1...maximumKeyIDLength).contains(bytes.count) && bytes.allSatisfy { byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
    }

    /// The protocol's id rule (PROTOCOL.md 2), with an empty device id meaning "any".
    static func isValidID(_ id: String, allowEmpty: Bool) -> Bool {
        let bytes = id.utf8
        guard bytes.count <= maximumIDLength, allowEmpty || !bytes.isEmpty else { return false }
        return !bytes.contains { $0 < 0x20 || $0 == 0x7f }
    }

    /// Decimal digits, no sign, no leading zero (but "0"), within Int64.
    static func parseSeconds(_ digits: some Collection<UInt8>) -> Int64? {
        guard !digits.isEmpty, digits.count <= 19, digits.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
        guard digits.first != 0x30 || digits.count == 1 else { return nil }
        return Int64(String(decoding: digits, as: UTF8.self))
    }
}
