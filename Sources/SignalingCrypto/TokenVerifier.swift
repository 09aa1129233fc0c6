/// What a verifier concluded about one HELLO's credentials.
public enum TokenVerdict: Equatable, Sendable {
    /// Accepted; `expiresAt` is the token's expiry (nil for a legacy token, which never expires).
    case accepted(expiresAt: Int64?)
    /// No credentials at all.
    case missing
    /// Not a token this server understands (or a legacy token that does not match).
    case malformed(String)
    /// A version 1 token naming a key id this server does not hold (retired, or not loaded yet).
    case unknownKey(String)
    /// The MAC does not match: tampered, or signed with another secret under this id.
    case badSignature
    /// A valid token for another user.
    case wrongUser(String)
    /// A valid token for another device of this user.
    case wrongDevice(String)
    /// A valid token whose expiry has passed.
    case expired(at: Int64)
    /// The cryptography library failed (out of memory): nothing is known about the token.
    case unavailable(String)
}

/// The keys a server accepts device tokens under, each prepared once, and the optional
/// legacy secret (`--auth-secret`: `hex(HMAC-SHA256(secret, userId))`, no expiry). Both
/// may be active at once, so devices can move from legacy tokens to version 1 tokens.
/// Immutable: a reload builds a new verifier. `verify` may run on any thread.
public final class TokenVerifier: Sendable {
    /// Key ids in file order.
    public let keyIDs: [String]
    private let keys: [String: HMACSHA256.Key]
    private let legacy: HMACSHA256.Key?

    /// With `keys` empty every version 1 token is `unknownKey`; with `legacySecret` nil
    /// every other credential is `malformed`. Throws only if OpenSSL cannot prepare a key.
    public init(keys: [TokenKey], legacySecret: String? = nil) throws(CryptoError) {
        var prepared: [String: HMACSHA256.Key] = [:]
        for key in keys { prepared[key.id] = try HMACSHA256.Key(key.secret) }
        self.keys = prepared
        self.keyIDs = keys.map(\.id)
        self.legacy = try legacySecret.map { (secret: String) throws(CryptoError) in try HMACSHA256.Key(Array(secret.utf8)) }
    }

    /// Checks `credentials` for a HELLO of `userID`/`deviceID` at Unix time `now` (seconds).
    /// The checks run in this order, and the first failure is the verdict: the format, the
    /// key id, the MAC (constant-time), the user, the device, the expiry. Nothing about a
    /// token is believed before its MAC has been checked.
    public func verify(_ credentials: [UInt8]?, userID: String, deviceID: String, now: Int64) -> TokenVerdict {
        guard let credentials else { return .missing }
        guard credentials.starts(with: DeviceToken.prefix) else {
            guard let legacy else { return .malformed("not a v1 device token") }
            do {
                return try LegacyToken.verify(credentials, key: legacy, userID: userID)
                    ? .accepted(expiresAt: nil) : .malformed("invalid legacy credentials for \(userID)")
            } catch {
                return .unavailable(error.message)
            }
        }
        guard let parts = DeviceToken.split(credentials) else { return .malformed("a v1 token has four dot-separated fields and a valid key id") }
        guard let key = keys[parts.keyID] else { return .unknownKey(parts.keyID) }
        let expected: [UInt8]
        do {
            expected = try key.authenticate(parts.signed)
        } catch {
            return .unavailable(error.message)
        }
        guard let mac = parts.mac, ConstantTime.equal(mac, expected) else { return .badSignature }
        guard let claims = DeviceToken.claims(ofPayload: parts.payload) else { return .malformed("the signed payload breaks the format") }
        guard claims.userID == userID else { return .wrongUser(claims.userID) }
        if let device = claims.deviceID, device != deviceID { return .wrongDevice(device) }
        guard now < claims.expiresAt else { return .expired(at: claims.expiresAt) }
        return .accepted(expiresAt: claims.expiresAt)
    }
}

/// The legacy credentials of `--auth-secret`: `hex(HMAC-SHA256(secret, userId))`, 64
/// lowercase hex digits as bytes. Bound to the user only, never expire, and cannot be
/// rotated without refusing every device: kept so existing deployments keep working
/// while they move to device tokens (docs/AUTH.md, "Legacy secret").
public enum LegacyToken {
    public static func make(secret: String, userID: String) throws(CryptoError) -> [UInt8] {
        try make(key: HMACSHA256.Key(Array(secret.utf8)), userID: userID)
    }

    public static func make(key: HMACSHA256.Key, userID: String) throws(CryptoError) -> [UInt8] {
        hex(try key.authenticate(Array(userID.utf8)))
    }

    /// Compares in constant time.
    public static func verify(_ token: [UInt8], key: HMACSHA256.Key, userID: String) throws(CryptoError) -> Bool {
        ConstantTime.equal(token, try make(key: key, userID: userID))
    }

    static func hex(_ bytes: [UInt8]) -> [UInt8] {
        var text: [UInt8] = []
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(hexDigit(byte >> 4))
            text.append(hexDigit(byte & 0x0f))
        }
        return text
    }

    /// The lowercase hex digit of a nibble, without a branch or a table lookup (the MAC
    /// is secret): 0x27 more for 10...15, the distance from '9' + 1 to 'a'.
    @inline(__always)
    static func hexDigit(_ nibble: UInt8) -> UInt8 {
        let above9 = UInt8(bitPattern: Int8(bitPattern: 9 &- nibble) >> 7)  // 0xff when nibble > 9
        return 0x30 &+ nibble &+ (above9 & 0x27)
    }
}
