import CLinuxShims
import SignalingSupport
import Testing
@testable import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

/// The parts of the latency method below the tools: kernel receive timestamps on real
/// loopback TCP sockets, nanosecond epoll waits, and the probe schedule.
@Suite struct ArrivalTimingTests {
    /// A connected loopback TCP pair (client, accepted server end).
    private func loopbackPair() throws -> (Int32, Int32) {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try #require(listener >= 0)
        defer { close(listener) }
        var address = SocketCalls.socketAddress((127 << 24) | 1, port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(listener, pointer, length) == 0 && listen(listener, 1) == 0 && getsockname(listener, pointer, &length) == 0
            }
        }
        try #require(bound)
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(connected == 0)
        let server = accept(listener, nil, nil)
        try #require(server >= 0)
        return (client, server)
    }

    @Test func kernelStampsTheArrivalOfEachReadBetweenSendAndRead() throws {
        let (client, server) = try loopbackPair()
        defer { close(client); close(server) }
        #expect(voipload_enable_receive_timestamps(server) == 0)
        var buffer = [UInt8](repeating: 0, count: 64)
        // The kernel switches receive timestamping on for the whole machine from a work
        // queue, a moment after the first socket asks (when no other socket has it on):
        // until then reads carry no stamp. Wait for the first stamp, with a deadline.
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(5)
        var warmedUp = false
        while !warmedUp && clock.now() < deadline {
            var byte: UInt8 = 0
            #expect(write(client, &byte, 1) == 1)
            var arrived: UInt64 = 0
            #expect(buffer.withUnsafeMutableBytes { voipload_read_stamped(server, $0.baseAddress, 1, &arrived) } == 1)
            warmedUp = arrived != 0
            if !warmedUp { usleep(1_000) }
        }
        try #require(warmedUp, "no receive timestamp within 5 s of SO_TIMESTAMPNS")
        for round in 0..<3 {
            let before = voipload_realtime_ns()
            var payload = [UInt8](repeating: UInt8(round), count: 16)
            #expect(write(client, &payload, payload.count) == payload.count)
            var arrived: UInt64 = 0
            let count = buffer.withUnsafeMutableBytes { voipload_read_stamped(server, $0.baseAddress, UInt($0.count), &arrived) }
            let after = voipload_realtime_ns()
            #expect(count == 16 && buffer[0] == UInt8(round))
            #expect(arrived >= before && arrived <= after, "round \(round): arrival \(arrived), send \(before), read \(after) (CLOCK_REALTIME ns)")
        }
    }

    @Test func readsWithoutTimestampsEnabledReportNone() throws {
        let (client, server) = try loopbackPair()
        // The client end is closed in the test (no defer for it: closing a descriptor
        // twice may close one another test has opened meanwhile under the same number).
        defer { close(server) }
        var payload: [UInt8] = [1, 2, 3]
        #expect(write(client, &payload, 3) == 3)
        var buffer = [UInt8](repeating: 0, count: 8)
        var arrived: UInt64 = 99
        let count = buffer.withUnsafeMutableBytes { voipload_read_stamped(server, $0.baseAddress, UInt($0.count), &arrived) }
        #expect(count == 3 && arrived == 0)
        close(client)
        let end = buffer.withUnsafeMutableBytes { voipload_read_stamped(server, $0.baseAddress, UInt($0.count), &arrived) }
        #expect(end == 0, "the peer's close reads as end of stream")
    }

    @Test func nanosecondEpollWaitTimesOutOrReturnsWhatIsReady() throws {
        let (client, server) = try loopbackPair()
        defer { close(client); close(server) }
        let epoll = try Epoll(capacity: 8)
        #expect(epoll.add(server, token: 7, events: Epoll.input) == 0)
        let clock = SystemClock()
        let started = clock.now()
        var ready: [UInt64] = []
        epoll.wait(timeoutNanoseconds: 3_000_000) { token, _ in ready.append(token) }
        #expect(ready.isEmpty)
        #expect(clock.now() - started >= .milliseconds(3), "returned before its timeout with nothing ready")
        var byte: UInt8 = 1
        #expect(write(client, &byte, 1) == 1)
        // Nothing else to wait for: a generous timeout that only a failure would reach.
        epoll.wait(timeoutNanoseconds: 10_000_000_000) { token, _ in ready.append(token) }
        #expect(ready == [7])
    }

    @Test func probesAreDueOneIntervalApartAndCountedFromTheirDueTime() {
        let schedule = ProbeSchedule(count: 1000, rate: 2000, mix: .both, startedAt: 5_000_000_000, sent: 0)
        #expect(schedule.dueAt(0) == 5_000_000_000)
        #expect(schedule.dueAt(1) == 5_000_500_000)
        #expect(schedule.dueAt(999) == 5_499_500_000)
        for number in [0, 1, 2, 10, 500, 998] {
            // At its due time a probe counts as due, and the next one not yet.
            #expect(schedule.due(now: schedule.dueAt(number)) == number + 1, "probe \(number)")
            #expect(schedule.due(now: schedule.dueAt(number + 1) - 1) == number + 1, "probe \(number)")
        }
    }
}
