#if canImport(Glibc)
import Glibc
#endif

/// A Linux PM QoS request on the CPUs' wake-up latency, held for the life of this object.
///
/// An idle CPU normally goes into the deepest idle state its driver offers; on a virtual
/// machine that is a halt, and waking a halted virtual CPU is a trip through the
/// hypervisor that costs tens of microseconds on every hop of a push (server woken by the
/// sender, device woken by the server). While any process holds `/dev/cpu_dma_latency`
/// open with a limit of L µs, the kernel only uses idle states that wake within L µs; with
/// 0 an idle CPU polls instead of halting, which on the 2-core benchmark VM roughly halves
/// the two-hop loopback floor (docs/LOAD-TESTING.md). The cost: idle CPUs spin, which burns power
/// (and host CPU on a shared host) but never takes CPU from runnable tasks.
///
/// The request is system-wide and ends when the descriptor is closed, also when the
/// process dies, so nothing needs restoring. Opening the device needs root (or write
/// access to it). This is what `tuned`'s latency-performance profile and `cyclictest` do.
public final class CPULatencyRequest: Sendable {
    public static let devicePath = "/dev/cpu_dma_latency"
    /// The limit the kernel reports when nobody asks for one (2,000 s: "no limit").
    public static let noLimit: Int32 = 2_000_000_000

    /// The limit asked for, in microseconds.
    public let microseconds: Int32
    private let descriptor: Int32

    public init(microseconds: Int32) throws(SystemError) {
        precondition(microseconds >= 0, "a CPU latency limit is not negative")
        let fd = open(Self.devicePath, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("open \(Self.devicePath)", errno) }
        // Exactly four bytes are read by the kernel as a binary s32 (any other length as
        // a hexadecimal string).
        var value = microseconds
        let written = write(fd, &value, MemoryLayout<Int32>.size)
        guard written == MemoryLayout<Int32>.size else {
            let code = written < 0 ? errno : EIO
            close(fd)
            throw SystemError("write \(Self.devicePath)", code)
        }
        self.microseconds = microseconds
        self.descriptor = fd
    }

    deinit {
        close(descriptor)
    }

    /// The limit in effect now, over all requests of all processes (`noLimit` when there is
    /// none), or nil when it cannot be read (no such device, not root).
    public static func currentLimit() -> Int32? {
        let fd = open(devicePath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var value: Int32 = 0
        guard read(fd, &value, MemoryLayout<Int32>.size) == MemoryLayout<Int32>.size else { return nil }
        return value
    }

    /// "none", "0 µs", or "unknown" (unreadable): for reports.
    public static func describeCurrentLimit() -> String {
        guard let limit = currentLimit() else { return "unknown" }
        return limit >= noLimit ? "none" : "\(limit) µs"
    }
}
