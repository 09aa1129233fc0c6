/// FNV-1a, 64 bits, over a string's UTF-8 bytes: a hash that is the same in every process,
/// on every node and at every start (Swift's `Hasher` is seeded per process). It places
/// users on routing shards (`ShardMap`) and on the instances of a sharded Redis store
/// (`RedisShards`), so changing it moves every user.
///
/// Over the contiguous UTF-8 bytes (a native or small string's own storage): about half
/// the instructions of iterating `utf8` (134 against 274 per lookup of a short id, which
/// was 7 % of a 2-shard fan-out's; callgrind, docs/LOAD-TESTING.md "Routing on more
/// cores"). Inlinable: it runs for every step a loop routes. Cost: O(length), no
/// allocation for a native string.
public enum StableHash {
    @inlinable
    public static func fnv1a(_ text: String) -> UInt64 {
        var text = text
        return text.withUTF8 { bytes in
            var hash: UInt64 = 0xcbf2_9ce4_8422_2325
            for byte in bytes {
                hash ^= UInt64(byte)
                hash = hash &* 0x0000_0100_0000_01b3
            }
            return hash
        }
    }
}
