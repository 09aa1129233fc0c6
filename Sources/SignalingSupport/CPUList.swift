import CLinuxShims

/// A list of CPU numbers as Linux writes them (`taskset -c`, cpusets): "3", "0-3",
/// "1,3,8-11". Order is kept and repeats are allowed: the list is read as "the i-th
/// thread on the i-th CPU", as `voipserver --loop-cpus` does.
public enum CPUList {
    /// The largest CPU number accepted (glibc's CPU_SETSIZE − 1).
    public static let maximumCPU = 1023

    public static func parse(_ text: String) throws(UsageError) -> [Int] {
        var cpus: [Int] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let bounds = item.split(separator: "-", omittingEmptySubsequences: false)
            guard (1...2).contains(bounds.count),
                  let first = number(bounds[0]), let last = bounds.count == 2 ? number(bounds[1]) : first
            else {
                throw UsageError("'\(text)' is not a CPU list (numbers and ranges such as 0-3,6, separated by commas)")
            }
            guard first <= last else { throw UsageError("CPU range \(item) runs backwards") }
            guard last <= maximumCPU else { throw UsageError("CPU \(last) is above the largest CPU number, \(maximumCPU)") }
            guard cpus.count + (last - first + 1) <= maximumCPU + 1 else { throw UsageError("the CPU list '\(text)' is too long") }
            cpus.append(contentsOf: first...last)
        }
        return cpus
    }

    /// CPUs the system has configured: valid CPU numbers are below this.
    public static var configuredCount: Int { Int(shim_configured_cpus()) }

    /// The CPUs this process may run on, in increasing order: its main thread's affinity
    /// mask, which `taskset`, a cpuset cgroup (containers, systemd's `AllowedCPUs=`) and
    /// `CPUAffinity=` narrow. Every CPU the system has configured if the mask cannot be
    /// read (it always can on Linux). One system call.
    public static func allowed() -> [Int] {
        let cpus = read { shim_process_cpus($0, $1) }
        return cpus.isEmpty ? Array(0..<configuredCount) : cpus
    }

    /// `0-3,6`: the CPUs (in increasing order) as `taskset -c` and
    /// `/proc/PID/status`'s `Cpus_allowed_list` write them; the inverse of `parse` for such
    /// a list.
    public static func format(_ cpus: [Int]) -> String {
        var ranges: [String] = []
        var index = cpus.startIndex
        while index < cpus.endIndex {
            var last = index
            while last + 1 < cpus.endIndex && cpus[last + 1] == cpus[last] + 1 { last += 1 }
            ranges.append(last == index ? "\(cpus[index])" : "\(cpus[index])-\(cpus[last])")
            index = last + 1
        }
        return ranges.joined(separator: ",")
    }

    /// A CPU list that a shim writes into a buffer (`fill(buffer, capacity)` returns how
    /// many it wrote, or a negative number on error: then empty).
    static func read(_ fill: (UnsafeMutablePointer<Int32>, Int32) -> Int32) -> [Int] {
        var buffer = [Int32](repeating: 0, count: maximumCPU + 1)
        let count = buffer.withUnsafeMutableBufferPointer { fill($0.baseAddress!, Int32($0.count)) }
        return count > 0 ? buffer.prefix(Int(count)).map(Int.init) : []
    }

    private static func number(_ text: Substring) -> Int? {
        guard !text.isEmpty, text.count <= 4, text.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int(text)
    }
}
