import CLinuxShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Where a thread stands in the kernel's scheduler, as far as this server moves it.
public enum SchedulingPriority: Equatable, Sendable {
    /// `SCHED_IDLE`: CPU time no thread of another policy wants; a waking one preempts it.
    case idle
    /// `SCHED_OTHER` at this nice value (-20...19; 0 is the default, 19 the lightest).
    case normal(nice: Int32)
}

/// A joinable POSIX thread running `body`. The server's event loops and store writer run on
/// threads of their own (not Dispatch or Swift concurrency): each blocks in a system call
/// for its whole life and owns its state for that life.
public struct JoinableThread: @unchecked Sendable {
    private let handle: pthread_t
    /// The name given at start (nil: none).
    public let name: String?
    /// The thread's kernel id, written by the thread itself before `body` runs, which `init`
    /// waits for: what the nice value is set by (`setPriority`).
    private let kernelID: KernelID

    private final class KernelID: Sendable {
        let value = Atomic<Int32>(0)
    }

    /// Starts the thread, named `name` when given (what `top -H` shows: at most 15
    /// bytes); crashes if the system cannot create one (nothing sensible to do). The name
    /// is set here, before this returns, not by the new thread once it runs: whoever looks
    /// right after (a test, `top`) sees it.
    public init(name: String? = nil, _ body: @escaping @Sendable () -> Void) {
        final class Box {
            let body: @Sendable () -> Void
            let kernelID: KernelID
            init(_ body: @escaping @Sendable () -> Void, _ kernelID: KernelID) { self.body = body; self.kernelID = kernelID }
        }
        let kernelID = KernelID()
        var handle = pthread_t()
        let box = Unmanaged.passRetained(Box(body, kernelID)).toOpaque()
        let rc = pthread_create(&handle, nil, { argument in
            let box = Unmanaged<Box>.fromOpaque(argument!).takeRetainedValue()
            box.kernelID.value.store(shim_current_thread_id(), ordering: .releasing)
            box.body()
            return nil
        }, box)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        // The kernel id exists only once the thread runs, and glibc gives no other way to
        // it: wait that moment (microseconds, once per thread) so that `setPriority` works
        // from the first call.
        while kernelID.value.load(ordering: .acquiring) == 0 { sched_yield() }
        if let name { shim_name_thread(UInt(handle), name) }
        self.handle = handle
        self.name = name
        self.kernelID = kernelID
    }

    /// Restricts the thread to the CPUs `cpus` (one CPU pins it). Returns 0 or the error
    /// number (EINVAL: no such CPU, or none this process may use; EPERM: a policy forbids
    /// it). One system call.
    public func pin(toCPUs cpus: [Int]) -> Int32 {
        let numbers = cpus.map { Int32(clamping: $0) }
        return numbers.withUnsafeBufferPointer { shim_pin_thread(UInt(handle), $0.baseAddress, Int32($0.count)) }
    }

    /// The CPUs the thread may run on, in increasing order (empty if the thread is gone).
    public var allowedCPUs: [Int] {
        CPUList.read { shim_thread_cpus(UInt(handle), $0, $1) }
    }

    /// Moves the thread to the idle scheduling policy (`SCHED_IDLE`: it runs only on CPU
    /// time no other thread wants) or to the normal one at a nice value. Returns 0 or the
    /// error number (EPERM: leaving the idle policy, or lowering the nice value, needs
    /// CAP_SYS_NICE or an RLIMIT_NICE of at least 20, so ask `mayRestoreFromIdle` before
    /// sending a thread there; ESRCH: the thread has ended). One
    /// system call for `.idle`, two for `.normal`.
    public func setPriority(_ priority: SchedulingPriority) -> Int32 {
        switch priority {
        case .idle:
            return shim_set_thread_idle(UInt(handle), 1)
        case .normal(let nice):
            // The nice value first: set while still idle it takes effect with the policy, so
            // the thread never runs at the normal policy with its old weight.
            let error = shim_set_thread_nice(kernelID.value.load(ordering: .acquiring), nice)
            guard error == 0 else { return error }
            return shim_set_thread_idle(UInt(handle), 0)
        }
    }

    /// The thread's policy and nice value now (nil: they cannot be read, the thread is gone).
    public var priority: SchedulingPriority? {
        switch shim_thread_is_idle(UInt(handle)) {
        case 1: return .idle
        case 0:
            let nice = shim_thread_nice(kernelID.value.load(ordering: .acquiring))
            return nice == Int32.min ? nil : .normal(nice: nice)
        default: return nil
        }
    }

    /// Moves the thread to the real-time policy `SCHED_FIFO` at `priority` (1-99): no
    /// thread of the normal or idle policy preempts it while it runs, and it preempts them
    /// when it wakes. 0 moves it back to the normal policy. Returns 0 or the error number
    /// (EPERM: needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least `priority`). One system call.
    public func setRealtime(priority: Int32) -> Int32 {
        shim_set_thread_fifo(UInt(handle), priority)
    }

    /// The thread's `SCHED_FIFO` priority, 0 under another policy (nil: the thread is gone).
    public var realtimePriority: Int32? {
        let priority = shim_thread_fifo_priority(UInt(handle))
        return priority < 0 ? nil : priority
    }

    /// Asks the scheduler for a slice of `slice` for the thread (`.zero`: the default slice
    /// again), keeping its policy and nice value. On Linux 6.12 and later (EEVDF's custom
    /// slices, clamped to 0.1-100 ms) a waking thread with a shorter slice than the thread
    /// running on its CPU preempts it at once, where one with the default slice may wait
    /// for the running one to reach the end of its own (1.4 ms on two CPUs); earlier kernels
    /// ignore the request. Returns 0 or the error number. One system call (two: the nice
    /// value is read first, as the call must restate it).
    public func setSlice(_ slice: Duration) -> Int32 {
        shim_set_thread_slice(kernelID.value.load(ordering: .acquiring), slice.wholeNanoseconds)
    }

    /// The thread's slice now: the one it asked for, or the kernel's default (1.4 ms on two
    /// CPUs); `.zero` from kernels that report none. Nil when it cannot be read.
    public var slice: Duration? {
        let nanoseconds = shim_thread_slice(kernelID.value.load(ordering: .acquiring))
        return nanoseconds < 0 ? nil : .nanoseconds(nanoseconds)
    }

    /// Whether this kernel keeps a slice per thread (`setSlice`): asked once, by a
    /// short-lived thread of this process of itself.
    public static let keepsSlicePerThread: Bool = {
        final class Answer: @unchecked Sendable { var kept = false }
        let answer = Answer()
        JoinableThread(name: "vs-slice-probe") {
            let tid = shim_current_thread_id()
            answer.kept = shim_set_thread_slice(tid, 500_000) == 0 && shim_thread_slice(tid) == 500_000
        }.join()  // the join orders the write before the read
        return answer.kept
    }()

    /// The CPU time the thread has used so far (nil: it cannot be read, the thread is gone):
    /// how busy it was between two reads. One system call (`clock_gettime` on the thread's
    /// CPU clock, which the vDSO does not serve).
    public var cpuTime: Duration? {
        var clock = clockid_t()
        guard pthread_getcpuclockid(handle, &clock) == 0 else { return nil }
        var time = timespec()
        guard clock_gettime(clock, &time) == 0 else { return nil }
        return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
    }

    /// Whether the thread runs at the idle policy now (nil: it cannot be read, the thread is gone).
    public var runsAtIdlePriority: Bool? { priority.map { $0 == .idle } }

    /// Whether this process may move a thread to the idle policy and back again, tried on
    /// a thread started for the purpose.
    public static var mayRestoreFromIdle: Bool { shim_may_restore_from_idle() == 1 }

    /// Waits for the thread to finish. Call once.
    public func join() {
        pthread_join(handle, nil)
    }
}
