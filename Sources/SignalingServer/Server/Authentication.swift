import SignalingCrypto
import SignalingProtocol

/// How the server turns its configuration into a token verifier, and a verdict into the
/// CLOSE a refused device gets (docs/AUTH.md, docs/PROTOCOL.md 7.1).
enum Authentication {
    /// The verifier for `configuration`'s keys and legacy secret; nil when neither is set
    /// (no authentication).
    static func verifier(for configuration: ServerConfiguration) throws(ServerError) -> TokenVerifier? {
        guard configuration.requiresAuthentication else { return nil }
        do {
            return try TokenVerifier(keys: configuration.authKeys, legacySecret: configuration.authSecret)
        } catch {
            throw ServerError("authentication: \(error.message)")
        }
    }

    /// The CLOSE for a refused verdict, and the reason to log; nil when accepted.
    ///
    /// Expired and unknown-key tokens are the normal end of a token's life and of a key
    /// rotation: the device asks its app for a fresh token and comes back (action
    /// `refreshCredentials`). The unknown key waits longer, since a server that has not
    /// loaded a new key yet needs a moment (a reload), not a flood. The others need a fix
    /// by a person, so they say stop.
    static func refusal(for verdict: TokenVerdict, userID: String) -> (close: Close, reason: String)? {
        switch verdict {
        case .accepted:
            return nil
        case .missing:
            return (Close(code: .unauthorized, message: "credentials required"), "credentials required")
        case .malformed(let detail):
            return (Close(code: .unauthorized, message: "invalid credentials: \(detail)"), detail)
        case .wrongUser(let user):
            let reason = "the token is for user \(user), not \(userID)"
            return (Close(code: .unauthorized, message: reason), reason)
        case .unknownKey(let keyID):
            let reason = "unknown key id \(keyID)"
            return (Close(code: .unknownKey, retryAfterMs: 1_000, retryJitterMs: 4_000,
                          message: "\(reason): get a fresh token and reconnect"), reason)
        case .badSignature:
            return (Close(code: .badSignature, message: "the token's signature does not match its key"), "bad signature")
        case .wrongDevice(let device):
            let reason = "the token is for device \(device)"
            return (Close(code: .wrongDevice, message: reason), reason)
        case .expired(let expiry):
            let reason = "the token expired at \(expiry)"
            return (Close(code: .tokenExpired, retryAfterMs: 0, retryJitterMs: 1_000,
                          message: "\(reason) (Unix seconds): get a fresh token and reconnect"), reason)
        case .unavailable(let detail):
            let reason = "cannot check credentials: \(detail)"
            return (Close(code: .internalError, retryAfterMs: 1_000, retryJitterMs: 5_000, message: reason), reason)
        }
    }
}
