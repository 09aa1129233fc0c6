import SignalingSupport
import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

/// Where the machine's CPU time went during the measurement, from /proc: the server's
/// and the probe's own user+system time, the kernel's interrupt work (loopback delivery
/// runs mostly in softirq), time the hypervisor stole, and what is left: other
/// processes sharing the cores, which make any latency figure worse.
struct CPUAccounting {
    struct Sample {
        var machineBusy: UInt64 = 0  // user + nice + system, all cores
        var interrupts: UInt64 = 0  // irq + softirq
        var steal: UInt64 = 0
        var probe: UInt64 = 0
        var server: UInt64?
        var nanoseconds: UInt64 = 0
    }

    /// Percentages of one core over the interval.
    struct Usage: Sendable {
        var server: Double?
        var probe: Double
        var interrupts: Double
        var steal: Double
        var others: Double
    }

    static func sample(serverPID: Int32?, at nanoseconds: UInt64) -> Sample {
        var sample = Sample(nanoseconds: nanoseconds)
        if let host = HostCPUTime.read() {
            sample.machineBusy = host.user + host.nice + host.system
            sample.interrupts = host.irq + host.softirq
            sample.steal = host.steal
        }
        sample.probe = processTicks("/proc/self/stat") ?? 0
        sample.server = serverPID.flatMap { processTicks("/proc/\($0)/stat") }
        return sample
    }

    /// What the machine, the probe and the server spent between two samples; intervals
    /// add up, so that the turns of a measurement (`--turns`) make one figure.
    struct Interval {
        var busy: UInt64 = 0
        var interrupts: UInt64 = 0
        var steal: UInt64 = 0
        var probe: UInt64 = 0
        var server: UInt64?
        var nanoseconds: UInt64 = 0

        static func between(_ start: Sample, _ end: Sample) -> Interval {
            func delta(_ a: UInt64, _ b: UInt64) -> UInt64 { b >= a ? b - a : 0 }
            var server: UInt64?
            if let a = start.server, let b = end.server { server = delta(a, b) }
            return Interval(
                busy: delta(start.machineBusy, end.machineBusy), interrupts: delta(start.interrupts, end.interrupts),
                steal: delta(start.steal, end.steal), probe: delta(start.probe, end.probe), server: server,
                nanoseconds: delta(start.nanoseconds, end.nanoseconds))
        }

        static func + (a: Interval, b: Interval) -> Interval {
            var server: UInt64?
            if let x = a.server, let y = b.server { server = x + y } else { server = a.server ?? b.server }
            return Interval(
                busy: a.busy + b.busy, interrupts: a.interrupts + b.interrupts, steal: a.steal + b.steal,
                probe: a.probe + b.probe, server: server, nanoseconds: a.nanoseconds + b.nanoseconds)
        }
    }

    static func usage(of interval: Interval) -> Usage {
        let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))
        let seconds = Double(interval.nanoseconds) / 1e9
        func percent(_ ticks: UInt64) -> Double { seconds > 0 ? Double(ticks) / ticksPerSecond / seconds * 100 : 0 }
        let ours = interval.probe + (interval.server ?? 0)
        return Usage(
            server: interval.server.map(percent), probe: percent(interval.probe),
            interrupts: percent(interval.interrupts), steal: percent(interval.steal),
            others: percent(interval.busy > ours ? interval.busy - ours : 0))
    }

    /// utime + stime of a /proc/PID/stat file.
    private static func processTicks(_ path: String) -> UInt64? {
        ProcessStats.readFile(path).flatMap(ProcessStats.parseCPUTicks(stat:))
    }
}
