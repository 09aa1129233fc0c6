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

    private static func number(_ text: Substring) -> Int? {
        guard !text.isEmpty, text.count <= 4, text.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int(text)
    }
}
