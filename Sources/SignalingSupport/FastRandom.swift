/// xoshiro256** (Blackman & Vigna): a fast, small, non-cryptographic generator, seeded
/// once from the system's generator. For identifiers that must be unique and hard to
/// guess by accident, not secrets (session ids: resuming also needs the user's
/// credentials). Saves a getrandom(2) system call per handshake.
public struct FastRandom: RandomNumberGenerator, Sendable {
    private var state: (UInt64, UInt64, UInt64, UInt64)

    public init() {
        var system = SystemRandomNumberGenerator()
        state = (system.next(), system.next(), system.next(), system.next())
        if state == (0, 0, 0, 0) { state.0 = 1 }  // the one forbidden state
    }

    public init(seed: (UInt64, UInt64, UInt64, UInt64)) {
        state = seed == (0, 0, 0, 0) ? (1, 0, 0, 0) : seed
    }

    /// A generator whose whole sequence follows from one number (repeatable tests and
    /// load runs): the four words of state are drawn from SplitMix64, as the authors of
    /// xoshiro recommend.
    public init(seed: UInt64) {
        var splitMix = seed
        func next() -> UInt64 {
            splitMix &+= 0x9E37_79B9_7F4A_7C15
            var z = splitMix
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        self.init(seed: (next(), next(), next(), next()))
    }

    /// Uniform in 0..<bound (bound > 0); the modulo bias is negligible for bounds far below 2^64.
    public mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }

    public mutating func next() -> UInt64 {
        let result = rotl(state.1 &* 5, 7) &* 9
        let t = state.1 << 17
        state.2 ^= state.0
        state.3 ^= state.1
        state.1 ^= state.2
        state.0 ^= state.3
        state.2 ^= t
        state.3 = rotl(state.3, 45)
        return result
    }

    private func rotl(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }
}
