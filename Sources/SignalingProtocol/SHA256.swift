/// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency-free so the codec
/// module stays pure Swift. Used only for credential tokens, never on a hot path.
public enum SHA256 {
    fileprivate static let k: [UInt32] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ]

    /// The 32-byte digest of `message`.
    public static func hash(_ message: [UInt8]) -> [UInt8] {
        var hasher = Hasher256()
        hasher.update(message)
        return hasher.finalize()
    }

    /// HMAC-SHA256 of `message` under `key`.
    public static func hmac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        HMACKey(key).authenticate(message)
    }

    /// An HMAC key with both padded key blocks already hashed, so that each MAC costs only
    /// the message's own blocks plus one (for a short message: two compressions, no
    /// allocation but the result). The server makes one from its secret at start.
    public struct HMACKey: Sendable {
        private let inner: Hasher256
        private let outer: Hasher256

        public init(_ key: [UInt8]) {
            var block = key.count > 64 ? SHA256.hash(key) : key
            block += [UInt8](repeating: 0, count: 64 - block.count)
            var inner = Hasher256()
            inner.update(block.map { $0 ^ 0x36 })
            var outer = Hasher256()
            outer.update(block.map { $0 ^ 0x5c })
            self.inner = inner
            self.outer = outer
        }

        public func authenticate(_ message: [UInt8]) -> [UInt8] {
            var innerHash = inner
            innerHash.update(message)
            var outerHash = outer
            outerHash.update(innerHash.finalize())
            return outerHash.finalize()
        }
    }

    /// Incremental SHA-256 over 64-byte blocks, state kept inline (no heap).
    struct Hasher256: Sendable {
        private var h = SIMD8<UInt32>(
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19)
        private var pending: [UInt8] = []
        private var length: UInt64 = 0

        mutating func update(_ bytes: [UInt8]) {
            length &+= UInt64(bytes.count)
            var offset = 0
            if !pending.isEmpty {
                let take = min(64 - pending.count, bytes.count)
                pending += bytes[..<take]
                offset = take
                guard pending.count == 64 else { return }
                pending.withUnsafeBytes { compress($0.baseAddress!) }
                pending.removeAll(keepingCapacity: true)
            }
            bytes.withUnsafeBytes { raw in
                while bytes.count - offset >= 64 {
                    compress(raw.baseAddress! + offset)
                    offset += 64
                }
            }
            if offset < bytes.count { pending += bytes[offset...] }
        }

        mutating func finalize() -> [UInt8] {
            let bitLength = length &* 8
            var tail = pending
            tail.append(0x80)
            while tail.count % 64 != 56 { tail.append(0) }
            for shift in stride(from: 56, through: 0, by: -8) { tail.append(UInt8(truncatingIfNeeded: bitLength >> UInt64(shift))) }
            tail.withUnsafeBytes { raw in
                for block in stride(from: 0, to: raw.count, by: 64) { compress(raw.baseAddress! + block) }
            }
            var digest = [UInt8](repeating: 0, count: 32)
            for index in 0..<8 {
                let word = h[index]
                digest[index * 4] = UInt8(truncatingIfNeeded: word >> 24)
                digest[index * 4 + 1] = UInt8(truncatingIfNeeded: word >> 16)
                digest[index * 4 + 2] = UInt8(truncatingIfNeeded: word >> 8)
                digest[index * 4 + 3] = UInt8(truncatingIfNeeded: word)
            }
            return digest
        }

        private mutating func compress(_ block: UnsafeRawPointer) {
            withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
                for i in 0..<16 {
                    let b = block + i * 4
                    w[i] = UInt32(b.load(as: UInt8.self)) << 24 | UInt32(b.load(fromByteOffset: 1, as: UInt8.self)) << 16
                        | UInt32(b.load(fromByteOffset: 2, as: UInt8.self)) << 8 | UInt32(b.load(fromByteOffset: 3, as: UInt8.self))
                }
                for i in 16..<64 {
                    let s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
                    let s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
                    w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
                }
                var (a, b, c, d, e, f, g, hh) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
                for i in 0..<64 {
                    let s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)
                    let ch = (e & f) ^ (~e & g)
                    let t1 = hh &+ s1 &+ ch &+ SHA256.k[i] &+ w[i]
                    let s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)
                    let maj = (a & b) ^ (a & c) ^ (b & c)
                    let t2 = s0 &+ maj
                    hh = g; g = f; f = e; e = d &+ t1; d = c; c = b; b = a; a = t1 &+ t2
                }
                h &+= SIMD8(a, b, c, d, e, f, g, hh)
            }
        }

        private func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }
    }

}

/// The credential scheme the server understands when it is given a secret: a device of
/// user U presents `hex(HMAC-SHA256(secret, U))` as its HELLO credentials. The secret stays
/// on the server and on whatever issues tokens (an app's login service, `voipload`).
public enum AuthToken {
    /// The key for `secret`, to make or verify many tokens with one secret.
    public static func key(secret: String) -> SHA256.HMACKey { SHA256.HMACKey(Array(secret.utf8)) }

    /// The token for `userID`: 64 lowercase hex digits, as bytes.
    public static func make(secret: String, userID: String) -> [UInt8] {
        make(key: key(secret: secret), userID: userID)
    }

    public static func make(key: SHA256.HMACKey, userID: String) -> [UInt8] {
        let mac = key.authenticate(Array(userID.utf8))
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(64)
        for byte in mac {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return out
    }

    /// Compares in time independent of where the first difference is.
    public static func verify(_ presented: [UInt8], secret: String, userID: String) -> Bool {
        verify(presented, key: key(secret: secret), userID: userID)
    }

    public static func verify(_ presented: [UInt8], key: SHA256.HMACKey, userID: String) -> Bool {
        let expected = make(key: key, userID: userID)
        guard presented.count == expected.count else { return false }
        var difference: UInt8 = 0
        for (a, b) in zip(presented, expected) { difference |= a ^ b }
        return difference == 0
    }
}
