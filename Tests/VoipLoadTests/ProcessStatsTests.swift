import Testing
@testable import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

@Suite struct ProcessStatsTests {
    @Test func residentSetFromStatus() {
        let status = "Name:\tvoipserver\nVmPeak:\t  90000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 8000 kB\n"
        #expect(ProcessStats.parseResidentBytes(status: status) == 12_345 * 1024)
        #expect(ProcessStats.parseResidentBytes(status: "Name:\tx\n") == nil)
        #expect(ProcessStats.parseResidentBytes(status: "VmRSS:\t12 MB\n") == nil)
    }

    @Test func cpuTicksSurviveACommandNameWithSpacesAndParentheses() {
        let stat = "4242 (voip server (x)) S 1 4242 4242 0 -1 4194560 500 0 0 0 731 269 0 0 20 0 3 0 100 1000000 300"
        #expect(ProcessStats.parseCPUTicks(stat: stat) == 1000)
        #expect(ProcessStats.parseCPUTicks(stat: "4242 (short) S 1") == nil)
    }

    @Test func socketSummaryFromSockstat() {
        let sockstat = """
            sockets: used 312
            TCP: inuse 30012 orphan 0 tw 3 alloc 30020 mem 17
            UDP: inuse 2 mem 4
            """
        #expect(ProcessStats.parseSocketSummary(sockstat: sockstat) == .init(tcpInUse: 30_012, tcpMemoryPages: 17))
        #expect(ProcessStats.parseSocketSummary(sockstat: "UDP: inuse 2 mem 4") == nil)
    }

    @Test func readsThisProcess() throws {
        let rss = try #require(ProcessStats.residentBytes(pid: getpid()))
        #expect(rss > 1_000_000)
        #expect(try #require(ProcessStats.cpuSeconds(pid: getpid())) >= 0)
        #expect(ProcessStats.socketSummary() != nil)
        #expect(ProcessStats.residentBytes(pid: Int32.max) == nil)
    }
}
