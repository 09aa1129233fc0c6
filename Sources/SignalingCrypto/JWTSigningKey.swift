import COpenSSLShims

/// A private key that signs JSON Web Tokens (RFC 7515 compact form) through OpenSSL:
/// ES256 for an EC P-256 key (Apple's `.p8` provider keys), RS256 for an RSA key (Google
/// service accounts). The algorithm follows from the key.
///
/// `@unchecked Sendable`: the key is written only by `init` and freed by `deinit`; signing
/// only reads it (each signature has its own OpenSSL context).
public final class JWTSigningKey: @unchecked Sendable {
    public enum Algorithm: String, Sendable {
        case es256 = "ES256"
        case rs256 = "RS256"
    }

    private let key: OpaquePointer
    public let algorithm: Algorithm

    /// Parses a PEM private key. Throws for anything that is not an EC P-256 or RSA key.
    public init(pem: String) throws(CryptoError) {
        var text = Array(pem.utf8)
        let parsed = text.withUnsafeMutableBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { vs_signing_key_from_pem($0.baseAddress, $0.count) }
        }
        // The PEM held a secret: do not leave a copy in freed memory.
        for index in text.indices { text[index] = 0 }
        guard let parsed else { throw CryptoError.openSSL("not a PEM private key (PKCS#8 \"PRIVATE KEY\" expected)") }
        switch vs_signing_key_type(parsed) {
        case VS_SIGNING_KEY_EC_P256: algorithm = .es256
        case VS_SIGNING_KEY_RSA: algorithm = .rs256
        default:
            vs_signing_key_free(parsed)
            throw CryptoError("the private key is neither an EC P-256 key (ES256) nor an RSA key (RS256)")
        }
        key = parsed
    }

    deinit { vs_signing_key_free(key) }

    /// The signature of `message` as JWS wants it: 64 bytes r||s for ES256, PKCS#1 v1.5
    /// for RS256.
    public func sign(_ message: [UInt8]) throws(CryptoError) -> [UInt8] {
        var signature = [UInt8](repeating: 0, count: 512)
        let length = message.withUnsafeBufferPointer { bytes in
            signature.withUnsafeMutableBufferPointer { vs_jwt_sign_sha256(key, bytes.baseAddress, bytes.count, $0.baseAddress, $0.count) }
        }
        guard length > 0 else { throw CryptoError.openSSL("\(algorithm.rawValue) signing failed") }
        return Array(signature.prefix(length))
    }

    /// `base64url(header).base64url(claims).base64url(signature)`. `headerJSON` and
    /// `claimsJSON` are complete JSON objects; the caller puts `"alg"` in the header (it
    /// must be `algorithm.rawValue`).
    public func token(headerJSON: String, claimsJSON: String) throws(CryptoError) -> String {
        let signingInput = Base64URL.encode(Array(headerJSON.utf8)) + "." + Base64URL.encode(Array(claimsJSON.utf8))
        return signingInput + "." + Base64URL.encode(try sign(Array(signingInput.utf8)))
    }
}
