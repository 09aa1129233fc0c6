import SignalingCrypto

/// The HELLO credentials the simulated devices present: a device token signed with the
/// key of `--auth-key-file` (valid for a day from the HELLO), or the legacy
/// `--auth-secret` token, or none. Keys are prepared once per worker: a reconnect storm
/// makes one MAC per HELLO, nothing more.
final class DeviceCredentials: Sendable {
    private let tokenKey: (id: String, key: HMACSHA256.Key)?
    private let legacyKey: HMACSHA256.Key?

    init(setup: WorkerSetup) {
        if let id = setup.tokenKeyID, let secret = setup.tokenKeySecret {
            tokenKey = (try? HMACSHA256.Key(secret)).map { (id, $0) }
        } else {
            tokenKey = nil
        }
        legacyKey = setup.authSecret.flatMap { try? HMACSHA256.Key(Array($0.utf8)) }
    }

    /// Nil when the run has no credentials (or OpenSSL failed: the server then refuses the
    /// device, which the run reports).
    func credentials(user: String, device: String, now unixSeconds: Int64) -> [UInt8]? {
        if let tokenKey {
            let claims = DeviceTokenClaims(userID: user, deviceID: device, expiresAt: unixSeconds + 86_400)
            return (try? DeviceToken.mint(claims, keyID: tokenKey.id, key: tokenKey.key)).map { Array($0.utf8) }
        }
        return legacyKey.flatMap { try? LegacyToken.make(key: $0, userID: user) }
    }
}
