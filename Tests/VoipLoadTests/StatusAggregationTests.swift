import Testing
@testable import VoipLoadKit

@Suite struct StatusAggregationTests {
    @Test func totalsAddUpEveryWorker() {
        var a = WorkerStatus(), b = WorkerStatus()
        a.idleConnected = 10; b.idleConnected = 5
        a.probesSent = 7; b.probesSent = 3
        a.probesDone = true; b.probesDone = false
        a.realtimeWorkers = 1; b.realtimeWorkers = 1
        a.disconnects = ["CLOSE goingAway": 2]; b.disconnects = ["CLOSE goingAway": 1, "read: reset": 4]
        let total = WorkerStatus.total([a, b])
        #expect(total.idleConnected == 15 && total.probesSent == 10 && !total.probesDone && total.realtimeWorkers == 2)
        #expect(total.disconnects == ["CLOSE goingAway": 3, "read: reset": 4])
        #expect(total.disconnects.summary == "read: reset (4), CLOSE goingAway (3)")
        #expect(total.disconnects.growth(since: a.disconnects) == ["CLOSE goingAway": 1, "read: reset": 4])
        #expect(WorkerStatus.total([]).probesDone)
    }

    @Test func peakRateUsesTheBestOneSecondWindow() {
        var tracker = RateTracker(resolution: 0.1)
        // 100/s for 2 s, then 1000/s for 1 s, then nothing for 1 s.
        var count: UInt64 = 0
        for step in 0...40 {
            let time = Double(step) / 10
            tracker.sample(time: time, count: count)
            count += time < 2 ? 10 : (time < 3 ? 100 : 0)
        }
        #expect(abs(tracker.peakRate(window: 1) - 1000) < 1)
        var short = RateTracker()
        short.sample(time: 0, count: 0)
        short.sample(time: 0.5, count: 50)
        #expect(short.peakRate(window: 1) == 100)
        #expect(RateTracker().peakRate() == 0)
    }

    @Test func workerLinesRoundTrip() throws {
        var status = WorkerStatus()
        status.handshakes = 12
        status.failures = ["CLOSE unauthorized": 1]
        let commands: [WorkerCommand] = [.connect(.idle), .probe(count: 5, rate: 10, mix: .both), .startFanout(window: 2), .quit]
        var buffer = LineBuffer()
        var bytes: [UInt8] = []
        for command in commands { bytes += WorkerLine.encode(command) }
        bytes += WorkerLine.encode(WorkerEvent.status(status))
        // Split anywhere: lines come out whole.
        let lines = buffer.append(bytes[0..<7]) + buffer.append(bytes[7...])
        #expect(lines.count == 5)
        #expect(lines.prefix(4).compactMap { WorkerLine.decode(WorkerCommand.self, from: $0) } == commands)
        #expect(WorkerLine.decode(WorkerEvent.self, from: lines[4]) == .status(status))
        #expect(WorkerLine.decode(WorkerCommand.self, from: Array("{\"nope\":1}".utf8)) == nil)
    }

    @Test func backoffIsBoundedFullJitter() {
        for attempt in UInt8(0)...20 {
            let ceiling = min(Backoff.capMilliseconds, Backoff.baseMilliseconds << UInt32(min(attempt, 10)))
            #expect(Backoff.delay(attempt: attempt, random: .max) <= ceiling)
            #expect(Backoff.delay(attempt: attempt, random: 0) == 0)
        }
    }
}
