import SignalingSupport

/// Which Redis instance of a sharded store holds a user (docs/STORAGE.md, "Several Redis
/// instances"): every key of one user (its `{u:U}` hash tag) lives on one instance, chosen
/// by jump consistent hash (Lamping and Veach, 2014) of a stable 64-bit hash of the user id.
///
/// Why jump hash: it needs no table (nothing to store, keep in step or load; the choice
/// depends only on the user id and the number of instances), spreads users evenly, and
/// when an instance is added at the end of the list moves only the users that must move
/// (about 1/(N+1) of them, all to the new instance). Those users' keys must be moved
/// before a node serves with the longer list: that migration is documented, not built
/// (docs/STORAGE.md), and the store refuses to open a list whose length or order does not
/// match what each instance recorded when it was created (`RedisLayout.instanceKey`).
///
/// The user hash is `StableHash.fnv1a` (the one `ShardMap` places users on loops with),
/// not Swift's `Hasher` (seeded per process): every node and every start must place a
/// user on the same instance.
/// Cost: O(length of the id) + O(log N) per call, no allocation.
enum RedisShards {
    /// The index (0..<count) of the instance that holds `user`'s keys; 0 when `count` is 1.
    static func instance(ofUser user: String, count: Int) -> Int {
        precondition(count >= 1, "a store has at least one instance")
        guard count > 1 else { return 0 }
        return jumpHash(StableHash.fnv1a(user), buckets: count)
    }

    /// Lamping and Veach's jump consistent hash: a bucket in 0..<buckets.
    static func jumpHash(_ key: UInt64, buckets: Int) -> Int {
        var key = key
        var bucket: Int64 = -1
        var next: Int64 = 0
        while next < Int64(buckets) {
            bucket = next
            key = key &* 2_862_933_555_777_941_757 &+ 1
            next = Int64(Double(bucket + 1) * (Double(1 << 31) / Double((key >> 33) + 1)))
        }
        return Int(bucket)
    }
}
