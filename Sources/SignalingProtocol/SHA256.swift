/// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency-free so the codec
/// module stays pure Swift. Used for credential tokens: the server verifies one per
/// handshake, which in a reconnect storm is tens of thousands a second, so the short
/// messages of an HMAC are hashed without a heap allocation but the digest.
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
            var outerHash = outer
            return outerHash.finalize(appending: innerHash.finalize(appending: message))
        }
    }

    /// Incremental SHA-256 over 64-byte blocks, state kept inline (no heap).
    struct Hasher256: Sendable {
        /// The eight state words as plain scalars: kept as a SIMD8, the compiler carried
        /// the rounds' rotating working variables in vector registers and shuffled them
        /// every round.
        private var h: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (
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

        /// The digest of everything so far and then `bytes`. Up to about two blocks of
        /// pending and new bytes together are padded and hashed from one buffer on the
        /// stack, without first gathering them in `pending` (an allocation for a short
        /// message, as an HMAC's are).
        mutating func finalize(appending bytes: [UInt8] = []) -> [UInt8] {
            // The padding needs 9 bytes after the message, in at most two blocks.
            guard pending.count + bytes.count <= 119 else {
                update(bytes)
                return finalize()
            }
            length &+= UInt64(bytes.count)
            let bitLength = length &* 8
            let used = pending.count + bytes.count
            let blocks = used < 56 ? 1 : 2
            let tail = pending
            withUnsafeTemporaryAllocation(byteCount: 128, alignment: 8) { buffer in
                buffer.initializeMemory(as: UInt8.self, repeating: 0)
                tail.withUnsafeBytes { buffer.copyMemory(from: $0) }
                bytes.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: buffer[tail.count...]).copyMemory(from: $0) }
                buffer[used] = 0x80
                buffer.storeBytes(of: bitLength.bigEndian, toByteOffset: blocks * 64 - 8, as: UInt64.self)
                for block in 0..<blocks { compress(buffer.baseAddress! + block * 64) }
            }
            let state = h
            return [UInt8](unsafeUninitializedCapacity: 32) { digest, count in
                let raw = UnsafeMutableRawBufferPointer(digest)
                withUnsafeBytes(of: state) { words in
                    for index in 0..<8 {
                        let word = words.load(fromByteOffset: index * 4, as: UInt32.self)
                        raw.storeBytes(of: word.bigEndian, toByteOffset: index * 4, as: UInt32.self)
                    }
                }
                count = 32
            }
        }

        private mutating func compress(_ block: UnsafeRawPointer) {
            // The constants through a buffer pointer: no bounds check in the rounds.
            SHA256.k.withUnsafeBufferPointer { k in
                withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
                    for i in 0..<16 {
                        w[i] = UInt32(bigEndian: block.loadUnaligned(fromByteOffset: i * 4, as: UInt32.self))
                    }
                    for i in 16..<64 {
                        let s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
                        let s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
                        w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
                    }
                    var (a, b, c, d, e, f, g, hh) = h
                    // Eight rounds per pass, each naming the working variables in their
                    // rotated order: no variable is moved from one to the next.
                    var i = 0
                    while i < 64 {
                        round(a, b, c, &d, e, f, g, &hh, k[i] &+ w[i])
                        round(hh, a, b, &c, d, e, f, &g, k[i + 1] &+ w[i + 1])
                        round(g, hh, a, &b, c, d, e, &f, k[i + 2] &+ w[i + 2])
                        round(f, g, hh, &a, b, c, d, &e, k[i + 3] &+ w[i + 3])
                        round(e, f, g, &hh, a, b, c, &d, k[i + 4] &+ w[i + 4])
                        round(d, e, f, &g, hh, a, b, &c, k[i + 5] &+ w[i + 5])
                        round(c, d, e, &f, g, hh, a, &b, k[i + 6] &+ w[i + 6])
                        round(b, c, d, &e, f, g, hh, &a, k[i + 7] &+ w[i + 7])
                        i += 8
                    }
                    h = (h.0 &+ a, h.1 &+ b, h.2 &+ c, h.3 &+ d, h.4 &+ e, h.5 &+ f, h.6 &+ g, h.7 &+ hh)
                }
            }
        }

        /// One round: `d` and `h` are the two words it changes.
        @inline(__always)
        private func round(
            _ a: UInt32, _ b: UInt32, _ c: UInt32, _ d: inout UInt32,
            _ e: UInt32, _ f: UInt32, _ g: UInt32, _ h: inout UInt32, _ constantAndWord: UInt32
        ) {
            let t1 = h &+ (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) &+ ((e & f) ^ (~e & g)) &+ constantAndWord
            let t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) &+ ((a & b) ^ (a & c) ^ (b & c))
            d = d &+ t1
            h = t1 &+ t2
        }

        /// Masking shifts: the amounts are constants in 1...31.
        private func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x &>> n) | (x &<< (32 &- n)) }
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
        return [UInt8](unsafeUninitializedCapacity: 2 * mac.count) { out, count in
            for (index, byte) in mac.enumerated() {
                out[2 * index] = hexDigit(byte >> 4)
                out[2 * index + 1] = hexDigit(byte & 0x0f)
            }
            count = 2 * mac.count
        }
    }

    /// The lowercase hex digit of a nibble, without a branch or a table lookup (the MAC
    /// is secret): 0x27 more for 10...15, the distance from '9' + 1 to 'a'.
    @inline(__always)
    static func hexDigit(_ nibble: UInt8) -> UInt8 {
        let above9 = UInt8(bitPattern: Int8(bitPattern: 9 &- nibble) >> 7)  // 0xff when nibble > 9
        return 0x30 &+ nibble &+ (above9 & 0x27)
    }

    /// Compares in time independent of where the first difference is.
    public static func verify(_ presented: [UInt8], secret: String, userID: String) -> Bool {
        verify(presented, key: key(secret: secret), userID: userID)
    }

    public static func verify(_ presented: [UInt8], key: SHA256.HMACKey, userID: String) -> Bool {
        let mac = key.authenticate(Array(userID.utf8))
        guard presented.count == 2 * mac.count else { return false }
        // Each presented digit against the MAC's, computed in place: no token is built.
        var difference: UInt8 = 0
        for (index, byte) in mac.enumerated() {
            difference |= presented[2 * index] ^ hexDigit(byte >> 4)
            difference |= presented[2 * index + 1] ^ hexDigit(byte & 0x0f)
        }
        return difference == 0
    }
}
