import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// A joinable POSIX thread running `body`. The server's event loops and store writer run on
/// threads of their own (not Dispatch or Swift concurrency): each blocks in a system call
/// for its whole life and owns its state for that life.
public struct JoinableThread: @unchecked Sendable {
    private let handle: pthread_t
    /// The name given at start (nil: none).
    public let name: String?

    /// Starts the thread, named `name` when given (what `top -H` shows: at most 15
    /// bytes); crashes if the system cannot create one (nothing sensible to do). The name
    /// is set here, before this returns, not by the new thread once it runs: whoever looks
    /// right after (a test, `top`) sees it.
    public init(name: String? = nil, _ body: @escaping @Sendable () -> Void) {
        final class Box {
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
        }
        var handle = pthread_t()
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        let rc = pthread_create(&handle, nil, { argument in
            Unmanaged<Box>.fromOpaque(argument!).takeRetainedValue().body()
            return nil
        }, box)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        if let name { shim_name_thread(UInt(handle), name) }
        self.handle = handle
        self.name = name
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
    /// time no other thread wants) or back to the normal one. Returns 0 or the error number
    /// (EPERM: coming back needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20, so ask
    /// `mayRestoreFromIdle` before sending a thread there). One system call.
    public func setIdlePriority(_ idle: Bool) -> Int32 {
        shim_set_thread_idle(UInt(handle), idle ? 1 : 0)
    }

    /// Whether the thread runs at the idle policy now (nil: it cannot be read, the thread is gone).
    public var runsAtIdlePriority: Bool? {
        switch shim_thread_is_idle(UInt(handle)) {
        case 1: true
        case 0: false
        default: nil
        }
    }

    /// Whether this process may move a thread to the idle policy and back again, tried on
    /// a thread started for the purpose.
    public static var mayRestoreFromIdle: Bool { shim_may_restore_from_idle() == 1 }

    /// Waits for the thread to finish. Call once.
    public func join() {
        pthread_join(handle, nil)
    }
}
