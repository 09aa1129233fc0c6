import Foundation
import Testing
@testable import VoipLoadKit

/// `voipload table`: one row per report, and the medians per size when a size was run
/// more than once (`BENCH_ROUNDS`).
@Suite struct ReportTableTests {
    /// A report with the figures the table reads; everything else minimal.
    func report(devices: Int, p99: Double, handshakes: Double, passed: Bool = true) throws -> LoadReport {
        let latency = #"{"count":100,"p50":12.5,"p90":15.5,"p99":\#(p99),"p999":90.5,"max":120,"mean":11}"#
        let json = """
            {"setup":{"server":"127.0.0.1:7443","serverStarted":true,"devices":\(devices),"workers":2,
             "sourceAddresses":64,"connectRate":0,"maxInFlightPerWorker":256,"payloadBytes":64},
             "connections":{"requested":\(devices),"connected":\(devices),"failed":0,"failureReasons":{},
             "disconnectReasons":{},"rampSeconds":1,"handshakesPerSecond":\(handshakes),
             "peakHandshakesPerSecond":\(handshakes),"handshakeLatency":\(latency)},
             "memory":{"serverBytesPerConnection":450,"toolRSS":1000,"toolBytesPerConnection":10},
             "push":{"requested":100,"rate":1000,"mix":"both","sent":100,"accepted":100,"refused":0,
             "received":100,"lost":0,"duplicates":0,"receipts":50,"callsEnded":50,
             "latency":\(latency),"messageLatency":\(latency),"callLatency":\(latency)},
             "problems":\(passed ? "[]" : #"["1 of 100 probes lost"]"#)}
            """
        return try JSONDecoder().decode(LoadReport.self, from: Data(json.utf8))
    }

    @Test func oneReportPerSizeIsOneRowEachSortedBySize() throws {
        let table = LoadReport.table([
            try report(devices: 15000, p99: 40, handshakes: 22000),
            try report(devices: 1000, p99: 30, handshakes: 6000.6),
        ])
        let lines = table.split(separator: "\n").map(String.init)
        #expect(lines.count == 3, "\(table)")
        #expect(lines[0].hasPrefix("devices") && lines[0].hasSuffix("result"))
        #expect(lines[1].hasPrefix("   1000") && lines[1].contains(" 30.0 ") && lines[1].contains(" 6001 "))
        #expect(lines[2].hasPrefix("  15000") && lines[2].contains(" 40.0 ") && lines[2].hasSuffix("PASS"))
        #expect(!table.contains("median"))
    }

    @Test func severalRoundsAddTheMedianOfEachColumnPerSize() throws {
        let table = LoadReport.table([
            try report(devices: 1000, p99: 10, handshakes: 5000),
            try report(devices: 15000, p99: 40, handshakes: 20000),
            try report(devices: 1000, p99: 30, handshakes: 7000),
            try report(devices: 15000, p99: 60, handshakes: 24000, passed: false),
            try report(devices: 1000, p99: 20, handshakes: 6000),
        ])
        let sections = table.components(separatedBy: "\nmedian per size:\n")
        #expect(sections.count == 2, "\(table)")
        // Every run keeps its row, sizes ascending, runs of one size in the order given.
        let runs = sections[0].split(separator: "\n").dropFirst().map(String.init)
        #expect(runs.count == 5)
        #expect(runs.map { $0.contains(" 10.0 ") } == [true, false, false, false, false])
        #expect(runs[1].contains(" 30.0 ") && runs[2].contains(" 20.0 ") && runs[4].hasSuffix("FAIL"))
        let medians = sections[1].split(separator: "\n").map(String.init)
        #expect(medians.count == 3)
        #expect(medians[0].hasSuffix("runs"))
        #expect(medians[1].hasPrefix("   1000") && medians[1].contains(" 20.0 ") && medians[1].contains(" 6000 "))
        #expect(medians[1].hasSuffix("3/3 PASS"))
        #expect(medians[2].hasPrefix("  15000") && medians[2].contains(" 50.0 ") && medians[2].contains(" 22000 "))
        #expect(medians[2].hasSuffix("1/2 PASS"))
    }

    @Test func medianOfOddEvenAndNone() {
        #expect(LoadReport.median([]) == nil)
        #expect(LoadReport.median([3, 1, 2]) == 2)
        #expect(LoadReport.median([4, 1, 3, 2]) == 2.5)
    }
}
