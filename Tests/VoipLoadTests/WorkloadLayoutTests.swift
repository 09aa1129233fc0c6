import Testing
import SignalingSupport
@testable import VoipLoadKit

@Suite struct WorkloadLayoutTests {
    @Test func everyDeviceBelongsToExactlyOneWorker() {
        let workers = 3
        var seen = Set<Int>()
        for worker in 0..<workers {
            let layout = WorkloadLayout(worker: worker, workerCount: workers, idleDevices: 1001, fanoutDevices: 10, sourceAddresses: 7)
            for slot in layout.idleSlots {
                guard case .idleDevice(let global) = layout.role(ofSlot: slot) else { Issue.record("slot \(slot)"); continue }
                #expect(seen.insert(global).inserted)
                #expect(layout.identity(ofSlot: slot) == ("d\(global)", "p"))
            }
            #expect(layout.role(ofSlot: layout.probeSenderSlot) == .probeSender)
            #expect(layout.role(ofSlot: layout.fanoutSenderSlot) == .fanoutSender)
            #expect(layout.slotCount == layout.idleCount + 2 + layout.fanoutDeviceCount)
            for slot in layout.fanoutDeviceSlots {
                #expect(layout.identity(ofSlot: slot).user == WorkloadLayout.fanoutUser)
            }
        }
        #expect(seen == Set(0..<1001))
        #expect((0..<workers).map { WorkloadLayout.share(of: 10, worker: $0, workers: workers) } == [4, 3, 3])
    }

    @Test func sourcesAreSpreadEvenlyOverLoopbackAddresses() {
        let addresses = 16
        var perAddress: [UInt32: Int] = [:]
        for worker in 0..<2 {
            let layout = WorkloadLayout(worker: worker, workerCount: 2, idleDevices: 1600, fanoutDevices: 0, sourceAddresses: addresses)
            for slot in layout.idleSlots { perAddress[layout.sourceAddress(ofSlot: slot), default: 0] += 1 }
        }
        #expect(perAddress.count == addresses)
        #expect(perAddress.values.allSatisfy { $0 == 100 })
        #expect(perAddress.keys.allSatisfy { $0 >> 24 == 127 })
        #expect(SocketCalls.dottedQuad(WorkloadLayout.sourceAddress(index: 0)) == "127.0.0.2")
        #expect(SocketCalls.dottedQuad(WorkloadLayout.sourceAddress(index: 254)) == "127.0.1.0")
    }

    @Test func userIDsStayShortEnoughToBeInline() {
        let layout = WorkloadLayout(worker: 1, workerCount: 2, idleDevices: 1_000_000, fanoutDevices: 100_000, sourceAddresses: 1)
        for slot in [0, layout.idleCount - 1, layout.probeSenderSlot, layout.fanoutSenderSlot, layout.slotCount - 1] {
            let identity = layout.identity(ofSlot: slot)
            #expect(identity.user.utf8.count <= 15 && identity.device.utf8.count <= 15)
        }
    }
}
