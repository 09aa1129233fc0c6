import SignalingProtocol
@testable import SignalingServer
import Testing

/// Each routing shard counts its own events' memory (`MemoryLedger`), so that no cache
/// line is written by every loop for every event; the budget's check adds the other
/// shards' counts as they last published them (`MemoryTotal`).
@Suite("The memory budget over shards: each shard counts its own events, the others' as they publish them")
struct MemoryBudgetShardTests {
    static let budget = 1 << 20

    func message(_ id: String, to recipient: String, size: Int) -> OutgoingMessage {
        OutgoingMessage(messageID: id, recipient: recipient, contentType: "t", body: [UInt8](repeating: 1, count: size))
    }

    /// Messages of `size` bytes from `sender` to users of its own shard that nobody uses
    /// (held there), until one is refused. Returns how many were accepted and the refusal.
    func fill(_ shards: inout TwoShards, from sender: DeviceRecord, size: Int) -> (accepted: Int, refusal: RequestError?) {
        var effects: [SwitchboardEffect] = []
        let shard = ShardMap.shard(of: sender.userID, count: 2)
        for index in 0..<100 {
            let ghost = TwoShards.user("ghost\(index)-", onShard: shard)
            switch shards.states[shard].send(message("m\(index)", to: ghost, size: size), from: sender, now: TwoShards.at(2), into: &effects) {
            case .success: continue
            case .failure(let error): return (index, error)
            }
        }
        return (100, nil)
    }

    @Test("a shard's held messages are counted in its own ledger and refused past the budget at once; another shard, which reads them as published every 64 KiB, refuses near the budget on the exact sum")
    func budgetAcrossShards() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.memoryBudget = Self.budget }
        let sender = try shards.attach(TwoShards.user("sender", onShard: 1), slot: 1, at: 1)
        let other = try shards.attach(TwoShards.user("other", onShard: 0), slot: 2, at: 1)

        let (accepted, refusal) = fill(&shards, from: sender, size: 60_000)
        #expect(refusal?.code == .capacityExceeded)
        #expect(accepted >= 16 && accepted <= 17, "a 1 MiB budget holds about 17 messages of 60 KB: \(accepted)")
        // Counted where they are held, not in a ledger every shard writes.
        #expect(shards.states[1].ledger.bytes >= accepted * 60_000)
        #expect(shards.states[0].ledger.bytes == 0)
        #expect(shards.states[0].ledger !== shards.states[1].ledger)

        // Shard 1 publishes its count each time it moved by 64 KiB: the total every shard
        // reads per message is that close to it; near the budget a check reads every shard.
        let exact = shards.states[0].ledger.bytes + shards.states[1].ledger.bytes
        #expect(abs(shards.states[1].ledger.total.bytes - exact) < MemoryTotal.publishStep)
        #expect(shards.states[0].heldBytes(adding: 100_000) == exact, "near the budget the check is exact")
        let refusedHere = shards.states[0].send(message("big", to: "nobody", size: 100_000), from: other, now: TwoShards.at(3), into: &effects)
        #expect(TwoShards.code(refusedHere.map { _ in 0 }) == .capacityExceeded)
    }

    @Test("far from the budget a check reads the published total, not every shard's count: at most a step per shard from the exact sum")
    func farFromTheBudget() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.memoryBudget = 64 << 20 }
        let sender = try shards.attach(TwoShards.user("sender", onShard: 1), slot: 1, at: 1)
        for index in 0..<5 {
            let ghost = TwoShards.user("ghost\(index)-", onShard: 1)
            #expect((try? shards.states[1].send(message("m\(index)", to: ghost, size: 20_000), from: sender, now: TwoShards.at(2), into: &effects).get()) != nil)
        }
        let exact = shards.states[1].ledger.bytes
        #expect(exact > MemoryTotal.publishStep)
        // 100 KB held: published once, on the add that crossed 64 KiB.
        #expect(shards.states[1].ledger.publishedBytes > MemoryTotal.publishStep && shards.states[1].ledger.publishedBytes < exact)
        #expect(shards.states[0].heldBytes() == shards.states[1].ledger.publishedBytes)
    }
}
