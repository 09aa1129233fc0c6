import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingSupport
import Testing

/// `StoreBatch.compacted`: the compacted batch leaves the store exactly as the original
/// would, while events acknowledged within their own batch never reach the disk.
@Suite("Store batches: events acknowledged within their batch are never written")
struct StoreBatchTests {
    @Test("an event and its acknowledgement in one batch: neither is written, the counters still move")
    func eventAndAcknowledgement() {
        let batch: [StoreChange] = [
            Sample.device("bob", "phone"),
            Sample.append("bob", "phone", 1),
            Sample.append("bob", "phone", 2),
            .acknowledge(user: "bob", device: "phone", through: 1),
            Sample.append("bob", "phone", 3),
            .acknowledge(user: "bob", device: "phone", through: 2),
        ]
        #expect(StoreBatch.compacted(batch) == [
            Sample.device("bob", "phone"),
            .acknowledge(user: "bob", device: "phone", through: 2),
            Sample.append("bob", "phone", 3),
        ])
    }

    @Test("acknowledgements merge at the first one, so space is freed before later inserts need it")
    func mergedAcknowledgementComesFirst() {
        let receipt = { (seq: UInt64) in StoreChange.appendEvent(user: "alice", device: "laptop", event: Sample.event(seq)) }
        let batch: [StoreChange] = [
            .acknowledge(user: "bob", device: "phone", through: 1), receipt(1),
            .acknowledge(user: "bob", device: "phone", through: 2), receipt(2),
            .acknowledge(user: "bob", device: "phone", through: 3), receipt(3),
        ]
        #expect(StoreBatch.compacted(batch) == [
            .acknowledge(user: "bob", device: "phone", through: 3), receipt(1), receipt(2), receipt(3),
        ])
    }

    @Test("an event or held event withdrawn later in its batch is not written; the withdrawal stays")
    func withdrawnWithinBatch() {
        let batch: [StoreChange] = [
            Sample.append("bob", "phone", 4),
            .holdForUser(user: "dave", event: Sample.event(1)),
            Sample.append("bob", "phone", 5),
            .withdrawEvent(user: "bob", device: "phone", seq: 4),
            .withdrawHeld(user: "dave", ordinal: 1),
            Sample.append("bob", "tablet", 4),
        ]
        #expect(StoreBatch.compacted(batch) == [
            Sample.append("bob", "phone", 5),
            .withdrawEvent(user: "bob", device: "phone", seq: 4),
            .withdrawHeld(user: "dave", ordinal: 1),
            Sample.append("bob", "tablet", 4),
        ])
        // A withdrawal does not reach back past the device's removal (another life).
        let lives: [StoreChange] = [
            Sample.append("bob", "phone", 1),
            .removeDevice(user: "bob", device: "phone"),
            .withdrawEvent(user: "bob", device: "phone", seq: 1),
        ]
        #expect(StoreBatch.compacted(lives) == lives)
    }

    @Test("a removed device's two lives are kept apart; other devices are untouched")
    func removeDeviceSeparatesLives() {
        let batch: [StoreChange] = [
            Sample.append("bob", "phone", 5),
            .removeDevice(user: "bob", device: "phone"),
            Sample.device("bob", "phone"),
            Sample.append("bob", "phone", 1),
            Sample.append("bob", "tablet", 1),
            .acknowledge(user: "bob", device: "phone", through: 1),
        ]
        #expect(StoreBatch.compacted(batch) == [
            Sample.append("bob", "phone", 5),
            .removeDevice(user: "bob", device: "phone"),
            Sample.device("bob", "phone"),
            Sample.append("bob", "tablet", 1),
            .acknowledge(user: "bob", device: "phone", through: 1),
        ])
        let untouched: [StoreChange] = [Sample.device("bob", "phone"), Sample.append("bob", "phone", 1)]
        #expect(StoreBatch.compacted(untouched) == untouched)
    }

    @Test("random server-like batches: the SQLite store given compacted batches matches the model given the originals",
          arguments: [1, 2, 3] as [UInt64])
    func randomBatches(seed: UInt64) throws {
        let harness = try StoreHarness()
        var model = ReferenceStore()
        var workload = ServerLikeWorkload(seed: seed)
        var original = 0
        var written = 0
        for _ in 0..<150 {
            let batch = workload.nextBatch()
            let compacted = StoreBatch.compacted(batch)
            original += batch.count
            written += compacted.count
            try harness.store.apply(compacted)
            model.apply(batch)
            #expect(try harness.store.loadSnapshot() == model.snapshot)
        }
        try harness.reopen()
        #expect(try harness.store.loadSnapshot() == model.snapshot)
        #expect(written < original, "nothing was compacted: the workload does not exercise it")
    }
}

/// Batches as the server produces them: devices appear, get events with increasing
/// numbers, acknowledge some of them (often in the same batch), expire and come back.
private struct ServerLikeWorkload {
    private struct Device {
        var live = false
        var lastSeq: UInt64 = 0
        var ackedSeq: UInt64 = 0
    }

    private var random: FastRandom
    private var devices: [String: Device] = [:]
    private let names = ["a", "b", "c", "d", "e"]

    init(seed: UInt64) { random = FastRandom(seed: seed) }

    mutating func nextBatch() -> [StoreChange] {
        var batch: [StoreChange] = []
        for _ in 0..<(1 + random.below(12)) {
            let name = names[random.below(names.count)]
            var device = devices[name] ?? Device()
            if !device.live {
                batch.append(Sample.device("u", name, session: UInt64(random.below(1000))))
                device = Device(live: true)
            }
            switch random.below(10) {
            case 0..<5:
                device.lastSeq += 1
                batch.append(Sample.append("u", name, device.lastSeq, bodySize: random.below(64)))
            case 5..<9 where device.lastSeq > device.ackedSeq:
                device.ackedSeq += UInt64(1 + random.below(Int(device.lastSeq - device.ackedSeq)))
                batch.append(.acknowledge(user: "u", device: name, through: device.ackedSeq))
            case 9:
                batch.append(.removeDevice(user: "u", device: name))
                device.live = false
            default:
                batch.append(Sample.device("u", name, session: UInt64(random.below(1000))))
            }
            // Now and then a refused message's event is withdrawn (in its own batch or later).
            if device.live && device.lastSeq > device.ackedSeq && random.below(8) == 0 {
                batch.append(.withdrawEvent(user: "u", device: name, seq: device.lastSeq - UInt64(random.below(2))))
            }
            devices[name] = device
        }
        return batch
    }
}
