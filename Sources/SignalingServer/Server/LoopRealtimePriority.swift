import SignalingSupport
import Synchronization

/// `--loop-realtime`: whether the event loops run under the real-time policy `SCHED_FIFO`.
public enum LoopRealtimeMode: Equatable, Sendable, CustomStringConvertible {
    /// `SCHED_FIFO` at priority 1 while the loops keep up and no ramp of connections is
    /// under way (`LoopRealtimeSupervision`), when the process may (CAP_SYS_NICE, or an
    /// RLIMIT_RTPRIO of at least 1; checked at start); the normal policy otherwise, and
    /// always with `busyPoll` (a polling loop would keep its CPU from every other thread).
    case auto
    /// The normal policy, like every other thread.
    case off
    /// `SCHED_FIFO` at this priority (1-99), supervised as with `auto`; a refusal logs a
    /// warning. Refused together with `busyPoll`.
    case priority(Int32)

    /// The priority a permitted process runs its loops at while they keep up (0: none).
    var wantedPriority: Int32 {
        switch self {
        case .auto: 1
        case .off: 0
        case .priority(let priority): priority
        }
    }

    /// The option's spelling: `auto`, `off` or the priority.
    public var description: String {
        switch self {
        case .auto: "auto"
        case .off: "off"
        case .priority(let priority): "\(priority)"
        }
    }
}

/// The event loops at a real-time priority while they keep up, at the normal policy
/// through a ramp of connections and while a loop is saturated. Loop 0 decides at each
/// tick (`observe`), the one owner; the caller moves the threads.
///
/// Why real-time: on a host whose cores the loops share with other busy threads (the load
/// tool on the benchmark's 2 cores, the store writer, a neighbour), a loop at the normal
/// policy is preempted in the middle of a request and, woken, waits for the thread on its
/// CPU. Under `SCHED_FIFO` neither happens: on the 2-core benchmark host that took the
/// default configuration's closed-loop push p99 from 1.5-2.7 times Mosquitto's to 0.96-1.26
/// (docs/LOAD-TESTING.md, "The loops at a real-time priority once the ramp is over").
///
/// Why not through a ramp: a real-time loop busy with thousands of handshakes a second
/// takes the CPU from the store writer, whose backlog then stays resident after the ramp
/// (711 B per idle device after 15,000 handshakes, against 475 at the normal policy). So
/// the loops start at the normal policy and rise only once connections have stopped
/// ramping for `raiseAfter`, and drop back as soon as a ramp starts again.
///
/// Why not while saturated: a loop that never sleeps leaves its CPU to threads of other
/// policies only as the kernel's real-time throttling allows (5 % by default,
/// `kernel.sched_rt_runtime_us`): the store writer, the push client and everything else on
/// the host would starve behind an overloaded server. A loop that was busy for
/// `saturatedShare` of the time between two looks is saturated, and the loops go back to
/// the normal policy, where the scheduler shares the CPU fairly; they rise again after
/// `raiseAfter` without it. So real-time serves only what it is for: a loop with slack,
/// whose latency it shortens.
///
/// Why not while the hypervisor steals: a sleeping real-time thread is woken on the CPU it
/// last ran on unless a real-time thread of its priority or higher runs there; a normal
/// thread goes to an idle CPU the hypervisor is running (the scheduler skips vCPUs it
/// reports preempted, `vcpu_is_preempted`). So while a virtual machine's vCPUs are being
/// preempted, a real-time loop woken for a request can wait for its vCPU to come back,
/// milliseconds, where a normal one runs at once on the other. On the 2-core test VM, in
/// the two benchmark runs whose paced phases the host stole 6.5-9.4 % of a core from, all
/// five servers with real-time loops had a paced p99 of 1.3-1.6 ms against Mosquitto's 190
/// µs in the same minutes (docs/LOAD-TESTING.md, "Real-time loops while the hypervisor
/// steals"). A look that finds the host stole
/// `stealShare` or more of its CPU time since the previous judged window (`/proc/stat`, at
/// least `LoopPriorityControl.stealWindow`) puts the loops back to the normal policy, as a
/// ramp does.
///
/// A transition returns what to do, the caller does it (`EventLoop.superviseLoopPriority`).
struct LoopRealtimeSupervision: Equatable, Sendable {
    /// What to do with the loops' threads.
    enum Action: Equatable, Sendable {
        /// To `SCHED_FIFO` at the priority: calm for `raiseAfter`.
        case raise
        /// Back to the normal policy, for this reason.
        case lower(Reason)
    }

    /// Why the loops went back to the normal policy (`/metrics`, the log).
    enum Reason: String, Equatable, Sendable, CaseIterable {
        /// Devices connecting at `ConnectionRamp.rampHandshakesPerSecond` or more.
        case ramp
        /// A loop busy for `saturatedShare` or more of the time since the previous look.
        case saturated
        /// The hypervisor stole `stealShare` or more of the host's CPU time.
        case steal
    }

    /// How long the loops must have had no ramp, no saturation and no steal before they
    /// rise: at most about one transition a second however the load swings, and a ramp's
    /// last handshakes are past (their units committed) before a loop takes the CPU from
    /// the writer.
    static let raiseAfter: Duration = .seconds(1)
    /// The share of the time between two looks a loop must have run (its thread's CPU
    /// time) to count as saturated: a loop with slack sleeps in `epoll_wait` for more.
    static let saturatedShare = 0.9
    /// The share of the host's CPU time (all CPUs) stolen by the hypervisor over a window
    /// that lowers the loops: 1 % is 2 % of a core on 2 vCPUs, where the test VM's quiet
    /// hours steal under 1 % of a core and its bad ones 6-10 %. (2 % until 4 December 2026:
    /// runs with 1-3 % of a core stolen, under that, already had real-time loops' paced
    /// p99 at 418 µs against 160 µs at the normal policy, docs/LOAD-TESTING.md.)
    static let stealShare = 0.01
    /// How long the loops stay at the normal policy once the hypervisor was seen stealing,
    /// with no steal since, before they rise: a VM's steal comes in episodes of minutes (a
    /// neighbour's busy spell), whose quiet seconds `raiseAfter` alone would take for the
    /// end, raising the loops into the next burst. A minute at the normal policy costs a
    /// little latency while calm (tens of µs of closed-loop p99 on the test VM); a burst met
    /// at real-time costs milliseconds.
    static let stealCalm: Duration = .seconds(60)

    /// Whether the loops run at the real-time priority now.
    private(set) var realtime = false
    /// Since when every look has found no ramp, no saturation and no steal (nil: the last
    /// one did).
    private var calmSince: Instant?
    /// The calm the loops need before they rise: `raiseAfter`, or `stealCalm` once a look
    /// found steal (back to `raiseAfter` when they rise).
    private var calmNeeded = Self.raiseAfter

    /// Loop 0's tick at `now`: whether devices are connecting in a ramp (`ConnectionRamp`),
    /// the largest share of the time since the previous look that any loop ran, and the
    /// share of the host's CPU time the hypervisor stole over the last judged window.
    mutating func observe(now: Instant, ramping: Bool, busiestLoopShare: Double, stolenShare: Double = 0) -> Action? {
        let reason: Reason? =
            ramping ? .ramp
            : busiestLoopShare >= Self.saturatedShare ? .saturated
            : stolenShare >= Self.stealShare ? .steal : nil
        // Steal counts whatever else the look found (a ramp is the reason given): the
        // loops then wait out `stealCalm`, whether they were at real-time or not.
        if stolenShare >= Self.stealShare { calmNeeded = Self.stealCalm }
        if let reason {
            calmSince = nil
            guard realtime else { return nil }
            realtime = false
            return .lower(reason)
        }
        guard !realtime else { return nil }
        guard let since = calmSince else {
            calmSince = now
            return nil
        }
        guard now - since >= calmNeeded else { return nil }
        realtime = true
        calmNeeded = Self.raiseAfter
        return .raise
    }
}

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): `LoopPriorityControl.threads`, a
// leaf held for the copy of an array: by the starting thread once, by loop 0 once per tick.

/// Loop 0's hold on the loops' scheduling policy (`--loop-realtime`): the supervision, the
/// loop threads it moves, and what `/metrics` reads of it.
///
/// Ownership: `observe` and the state it keeps run on loop 0's thread only (checked in
/// debug builds, once the threads are handed over); `threads` is set once by the starting
/// thread after the loops' threads exist, under its lock, which loop 0 takes once per tick
/// to read it; the counters are atomics any thread reads.
final class LoopPriorityControl: @unchecked Sendable {
    /// The `SCHED_FIFO` priority the loops take while calm (1-99).
    let priority: Int32
    private let threads = Mutex<[JoinableThread]>([])
    /// Loop 0's.
    private var supervision = LoopRealtimeSupervision()
    /// Each loop's CPU time at the previous look, and when (the real clock: CPU time is
    /// real time, whatever the server's injected clock says).
    private var lastLook: (at: Instant, cpuTimes: [Duration])?
    /// The largest share of the last window of at least `busyWindow` that a loop ran.
    private var busiestLoopShare = 0.0
    /// The shortest window of real time over which a loop's busy share is judged: a tick
    /// at the default interval (250 ms) judges each one.
    static let busyWindow: Duration = .milliseconds(200)
    /// The shortest window over which the host's stolen time is judged: `/proc/stat`
    /// counts in hundredths of a second, so over a second of 2 CPUs one count is 0.5 % of
    /// the host's time, a quarter of `stealShare`. Loop 0 reads the file once a window
    /// (`HostCPUTime`: about 20 µs on the test host).
    static let stealWindow: Duration = .seconds(1)
    /// The host's CPU time at the previous judged steal window (nil: none yet, or no
    /// `/proc/stat`), and the share stolen over the last window.
    private var lastStealLook: (at: Instant, time: HostCPUTime)?
    private var stolenShare = 0.0
    /// Where the host's CPU time is read (`/proc/stat`; tests give another file).
    private let hostCPUTimePath: String
    /// Whether the loops run at the real-time priority now (`/metrics`).
    let realtimeNow = Atomic<Bool>(false)
    /// Raises to the real-time priority, and lowerings by reason (`/metrics`).
    let raises = Atomic<Int>(0)
    let loweredForRamp = Atomic<Int>(0)
    let loweredSaturated = Atomic<Int>(0)
    let loweredForSteal = Atomic<Int>(0)
    private let logger: Logger

    init(priority: Int32, logger: Logger, hostCPUTimePath: String = HostCPUTime.path) {
        self.priority = priority
        self.logger = logger
        self.hostCPUTimePath = hostCPUTimePath
    }

    /// The starting thread, once: the threads to move. Until then `observe` moves nothing.
    func control(_ loopThreads: [JoinableThread]) {
        threads.withLock { $0 = loopThreads }
    }

    /// Loop 0's tick at `now` (the server's clock): looks at the loops' CPU time since the
    /// previous judged window and moves their threads if the supervision says so. One lock,
    /// and one `clock_gettime` per loop once a window has passed; one system call per loop
    /// on a transition.
    func observe(now: Instant, ramping: Bool) {
        let loopThreads = threads.withLock { $0 }
        // No threads: a server whose loops run on no thread of their own (an embedded loop
        // driven by a test or a benchmark, `EventLoop.ownedElsewhere`): nothing to move.
        guard !loopThreads.isEmpty else { return }
        #if DEBUG
        assert(EventLoop.onCurrentThread { $0.index == 0 } == true, "the loops' priority was supervised off loop 0's thread, its owner")
        #endif
        let real = SystemClock().now()
        if let lastLook, real - lastLook.at < Self.busyWindow {
            // Too short a window to judge: a tick that ran late, right after a long callback,
            // would find its loop "busy" for all of a few µs. Keep the last window's answer.
        } else {
            let cpuTimes = loopThreads.map { $0.cpuTime ?? .zero }
            if let lastLook, lastLook.cpuTimes.count == cpuTimes.count {
                let elapsed = (real - lastLook.at).seconds
                busiestLoopShare = zip(lastLook.cpuTimes, cpuTimes).map { ($1 - $0).seconds / elapsed }.max() ?? 0
            }
            lastLook = (real, cpuTimes)
        }
        if lastStealLook.map({ real - $0.at >= Self.stealWindow }) ?? true, let time = HostCPUTime.read(hostCPUTimePath) {
            if let lastStealLook { stolenShare = time.stolenShare(since: lastStealLook.time) }
            lastStealLook = (real, time)
        }
        let busiest = busiestLoopShare
        let stolen = stolenShare
        guard let action = supervision.observe(now: now, ramping: ramping, busiestLoopShare: busiest, stolenShare: stolen)
        else { return }
        switch action {
        case .raise:
            // A refusal now (a cgroup's real-time budget withdrawn, a seccomp filter) leaves
            // the loops at the normal policy; the next calm second tries again.
            let refusal = loopThreads.lazy.map { $0.setRealtime(priority: self.priority) }.first { $0 != 0 }
            if let refusal {
                for thread in loopThreads { _ = thread.setRealtime(priority: 0) }
                supervision = LoopRealtimeSupervision()
                logger.debug("loops_realtime_refused", ["detail": SystemError("pthread_setschedparam", refusal).reason])
                return
            }
            realtimeNow.store(true, ordering: .relaxed)
            raises.add(1, ordering: .relaxed)
            logger.debug("loops_realtime", ["priority": priority])
        case .lower(let reason):
            for thread in loopThreads { _ = thread.setRealtime(priority: 0) }
            realtimeNow.store(false, ordering: .relaxed)
            switch reason {
            case .ramp: loweredForRamp.add(1, ordering: .relaxed)
            case .saturated: loweredSaturated.add(1, ordering: .relaxed)
            case .steal: loweredForSteal.add(1, ordering: .relaxed)
            }
            logger.debug("loops_normal", [
                "reason": reason.rawValue, "busiest_loop_share": (busiest * 100).rounded() / 100,
                "stolen_share": (stolen * 1000).rounded() / 1000,
            ])
        }
    }
}
