/// The host's CPU time so far, all CPUs, in clock ticks: the `cpu` line of `/proc/stat`.
/// Read by the server's loop supervision (the share the hypervisor steals,
/// `LoopPriorityControl`) and by reference-probe (where the machine's time went during a
/// measurement), through this one parser.
///
/// Cost: the kernel renders the whole file for any read of it (every CPU's line, every
/// interrupt's count): about 20 µs on the 2-CPU test host, more with many CPUs.
public struct HostCPUTime: Equatable, Sendable {
    public static let path = "/proc/stat"

    public var user: UInt64
    public var nice: UInt64
    public var system: UInt64
    public var idle: UInt64
    public var iowait: UInt64
    public var irq: UInt64
    public var softirq: UInt64
    public var steal: UInt64

    public init(
        user: UInt64 = 0, nice: UInt64 = 0, system: UInt64 = 0, idle: UInt64 = 0, iowait: UInt64 = 0, irq: UInt64 = 0,
        softirq: UInt64 = 0, steal: UInt64 = 0
    ) {
        (self.user, self.nice, self.system, self.idle) = (user, nice, system, idle)
        (self.iowait, self.irq, self.softirq, self.steal) = (iowait, irq, softirq, steal)
    }

    /// Every tick counted: user + nice + system + idle + iowait + irq + softirq + steal.
    public var total: UInt64 { user + nice + system + idle + iowait + irq + softirq + steal }

    /// Parses the first line of `path`, which must be the `cpu` line; nil for anything else
    /// (no such file, another format).
    public static func read(_ path: String = path) -> HostCPUTime? {
        guard let line = readTextFile(path)?.split(separator: "\n", maxSplits: 1).first else { return nil }
        let fields = line.split(separator: " ")
        guard fields.count > 8, fields[0] == "cpu" else { return nil }
        let values = fields[1...8].compactMap { UInt64($0) }
        guard values.count == 8 else { return nil }
        return HostCPUTime(
            user: values[0], nice: values[1], system: values[2], idle: values[3], iowait: values[4], irq: values[5],
            softirq: values[6], steal: values[7])
    }

    /// The share of the time since `earlier` that was stolen (0 when none passed).
    public func stolenShare(since earlier: HostCPUTime) -> Double {
        guard total > earlier.total, steal >= earlier.steal else { return 0 }
        return Double(steal - earlier.steal) / Double(total - earlier.total)
    }
}
