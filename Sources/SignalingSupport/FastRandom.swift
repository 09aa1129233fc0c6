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
