import COpenSSLShims

/// HMAC-SHA256 (RFC 2104) computed by OpenSSL's libcrypto.
public enum HMACSHA256 {
    /// The MAC's length in bytes.
    public static let length = Int(VS_SHA256_DIGEST_LENGTH)

    /// The MAC of `message` under `key` (prepares the key each time: for one MAC; a
    /// verifier that checks many keeps a `Key`).
    public static func authenticate(_ message: some Collection<UInt8>, key: some Collection<UInt8>) throws(CryptoError) -> [UInt8] {
        try Key(Array(key)).authenticate(message)
    }

    /// A key prepared once: OpenSSL's context with the padded key blocks already hashed,
    /// so a MAC costs a copy of that context plus the message's blocks. Never modified
    /// after `init`, so any number of threads may use one key at once.
    ///
    /// `@unchecked Sendable`: the context is written only by `init` and freed by `deinit`;
    /// `authenticate` passes it to OpenSSL as const (it is duplicated, never updated).
    public final class Key: @unchecked Sendable {
        private let context: OpaquePointer

        /// Throws for an empty key (OpenSSL reads an empty key as "keep the previous one")
        /// or when OpenSSL cannot make the context.
        public init(_ key: [UInt8]) throws(CryptoError) {
            guard !key.isEmpty else { throw CryptoError("an HMAC key must not be empty") }
            guard let context = key.withUnsafeBufferPointer({ vs_hmac_sha256_key_new($0.baseAddress, $0.count) }) else {
                throw CryptoError.openSSL("cannot prepare an HMAC-SHA256 key")
            }
            self.context = context
        }

        deinit { vs_hmac_sha256_key_free(context) }

        /// The 32-byte MAC of `message`.
        public func authenticate(_ message: some Collection<UInt8>) throws(CryptoError) -> [UInt8] {
            var mac = [UInt8](repeating: 0, count: HMACSHA256.length)
            let status = message.withContiguousStorageIfAvailable { bytes in
                mac.withUnsafeMutableBufferPointer { vs_hmac_sha256(context, bytes.baseAddress, bytes.count, $0.baseAddress) }
            } ?? Array(message).withUnsafeBufferPointer { bytes in
                mac.withUnsafeMutableBufferPointer { vs_hmac_sha256(context, bytes.baseAddress, bytes.count, $0.baseAddress) }
            }
            guard status == 1 else { throw CryptoError.openSSL("HMAC-SHA256 failed") }
            return mac
        }
    }
}

/// Comparisons whose time does not depend on where two secrets differ.
public enum ConstantTime {
    /// True when `a` and `b` are equal. Lengths are compared first (a MAC's length is not
    /// secret); equal lengths are compared with CRYPTO_memcmp, which reads every byte.
    public static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        guard !a.isEmpty else { return true }
        return a.withUnsafeBytes { x in b.withUnsafeBytes { y in vs_crypto_equal(x.baseAddress, y.baseAddress, x.count) == 1 } }
    }
}

/// Bytes from OpenSSL's cryptographically secure generator (RAND_bytes).
public enum SecureRandom {
    public static func bytes(_ count: Int) throws(CryptoError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard count > 0 else { return bytes }
        guard bytes.withUnsafeMutableBufferPointer({ vs_random_bytes($0.baseAddress, $0.count) }) == 1 else {
            throw CryptoError.openSSL("RAND_bytes failed")
        }
        return bytes
    }
}

/// A failure of the cryptography library, or a key it cannot use.
public struct CryptoError: Error, Equatable, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }

    /// `message` with OpenSSL's last error on this thread appended, when it has one.
    static func openSSL(_ message: String) -> CryptoError {
        var text = [CChar](repeating: 0, count: 256)
        guard vs_crypto_last_error(&text, text.count) != 0 else { return CryptoError(message) }
        let detail = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return CryptoError("\(message): \(detail)")
    }
}
