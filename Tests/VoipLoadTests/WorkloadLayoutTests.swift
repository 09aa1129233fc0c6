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

    @Test("fan-out devices are dealt evenly to the fan-out users, and each worker's messages go to every user in turn")
    func fanoutDevicesAreDealtToTheUsers() {
        let workers = 3, users = 4
        var devicesPerUser: [String: Int] = [:]
        var firstRecipients: [String] = []
        for worker in 0..<workers {
            let layout = WorkloadLayout(
                worker: worker, workerCount: workers, idleDevices: 0, fanoutDevices: 64, fanoutUsers: users, sourceAddresses: 1)
            for slot in layout.fanoutDeviceSlots { devicesPerUser[layout.identity(ofSlot: slot).user, default: 0] += 1 }
            #expect(layout.fanoutDevicesPerUser == 16)
            let recipients = (0..<UInt64(2 * users)).map { layout.fanoutRecipient(ofMessage: $0) }
            #expect(Set(recipients) == ["fan0", "fan1", "fan2", "fan3"])
            #expect(Array(recipients[0..<users]) == Array(recipients[users...]))
            firstRecipients.append(recipients[0])
        }
        #expect(devicesPerUser == ["fan0": 16, "fan1": 16, "fan2": 16, "fan3": 16])
        #expect(Set(firstRecipients).count == workers, "each worker starts at its own user")
        // One user: the name every earlier run used.
        let single = WorkloadLayout(worker: 0, workerCount: 1, idleDevices: 0, fanoutDevices: 8, sourceAddresses: 1)
        #expect(single.fanoutRecipient(ofMessage: 5) == WorkloadLayout.fanoutUser && single.fanoutDevicesPerUser == 8)
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
