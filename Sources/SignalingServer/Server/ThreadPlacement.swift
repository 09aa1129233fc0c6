import SignalingSupport

/// `--thread-placement`: whether the server chooses CPUs for its busy threads itself.
public enum ThreadPlacementMode: String, Sendable, CaseIterable {
    /// With a store and CPUs to spare (more allowed CPUs than loops): loop *i* on the
    /// *i*-th CPU the process may use, the store writer and the store's own threads on the
    /// rest (`ThreadPlacement.plan`). Otherwise the scheduler places them.
    case auto
    /// The scheduler places every thread (except loops `--loop-cpus` names).
    case off
}

/// Which CPUs the event loops and the store's threads get at start: a pure function of the
/// configuration and of the CPUs the process may use (`plan`), applied once by
/// `SignalingServer.start` (`pin`), reported by the `thread_placement` log line and
/// `voipserver_thread_cpus` (`/metrics`).
///
/// Why auto exists: on a small host, the store writer (a burst of SQLite work after each
/// group commit) and the WAL checkpointer were put by the scheduler on the loop's CPU
/// as often as not, and the loop waited for them. Each loop on a CPU of its own and the
/// store's threads on the others keeps them apart. Why it is not the default: a pinned
/// loop also cannot leave its CPU when something else (the clients on the same host, a
/// neighbour) runs there, and on a quiet 2-core host that cost more than it saved: paced
/// push p99 2-3 times worse, p50 3-4 µs worse, closed-loop p99 a little better
/// (docs/LOAD-TESTING.md, "Thread placement"). It pays on a busy host.
struct ThreadPlacement: Equatable, Sendable {
    enum Source: String, Sendable {
        /// `--loop-cpus`: the loops where the operator said; nothing else moved.
        case loopCPUs = "loop-cpus"
        /// Auto placement applied.
        case auto
        /// Auto found nothing to do (`detail` says why): the scheduler places the threads.
        case none
        /// `--thread-placement off`.
        case off
        /// Auto placement was refused (`detail`: which thread, the error): every thread
        /// got its former mask back.
        case refused
    }

    var source: Source
    /// The CPU of loop *i*; empty: the loops run where the scheduler puts them.
    var loops: [Int]
    /// The CPUs of the store writer and of the store's own threads; empty: anywhere.
    var store: [Int]
    /// Why auto placed nothing, or what was refused.
    var detail: String?

    /// The placement for `loops` loops, a durable store or none, and the CPUs the process
    /// may use (`CPUList.allowed()`). `loopCPUs` (`--loop-cpus`) wins over `mode`: it keeps
    /// its meaning, loop *i* on `loopCPUs[i % count]`, and moves nothing else.
    static func plan(mode: ThreadPlacementMode, loopCPUs: [Int], allowed: [Int], loops: Int, durableStore: Bool) -> ThreadPlacement {
        if !loopCPUs.isEmpty {
            return ThreadPlacement(source: .loopCPUs, loops: (0..<loops).map { loopCPUs[$0 % loopCPUs.count] }, store: [])
        }
        switch mode {
        case .off:
            return ThreadPlacement(source: .off, loops: [], store: [])
        case .auto:
            // Without a store the loops are the only busy threads: nothing competes with
            // them that placement could keep away.
            guard durableStore else {
                return ThreadPlacement(source: .none, loops: [], store: [], detail: "no store threads to keep off the loops' CPUs")
            }
            guard allowed.count > loops else {
                return ThreadPlacement(
                    source: .none, loops: [], store: [],
                    detail: "no CPU to spare for the store: \(loops) loops, \(allowed.count) CPUs (\(CPUList.format(allowed)))")
            }
            return ThreadPlacement(source: .auto, loops: Array(allowed.prefix(loops)), store: Array(allowed.dropFirst(loops)))
        }
    }

    /// What the placement gives each thread, for the log line and `/metrics`: the loops'
    /// names (`vs-loop-N`) and the store's threads' names with their CPU lists (`any`:
    /// where the scheduler puts it).
    func threads(loopCount: Int, storeThreads: [String]) -> [(thread: String, cpus: String)] {
        (0..<loopCount).map { ("vs-loop-\($0)", loops.isEmpty ? "any" : String(loops[$0])) }
            + storeThreads.map { ($0, store.isEmpty ? "any" : CPUList.format(store)) }
    }

    /// A pin that did not take: the thread, the CPUs it was to get, the error number.
    struct Refusal: Error, Equatable {
        var thread: String
        var cpus: [Int]
        var error: Int32
    }

    /// Restricts each thread to its CPUs, in order (one system call per thread, two more to
    /// save its mask). At the first refusal, the threads already moved get back the masks
    /// they had, so a refused placement leaves every thread as the scheduler had it, and the
    /// refusal is returned; nil when every pin took.
    static func pin(_ assignments: [(thread: JoinableThread, cpus: [Int])]) -> Refusal? {
        var moved: [(thread: JoinableThread, former: [Int])] = []
        for (thread, cpus) in assignments {
            let former = thread.allowedCPUs
            let error = thread.pin(toCPUs: cpus)
            guard error == 0 else {
                for (thread, former) in moved.reversed() where !former.isEmpty { _ = thread.pin(toCPUs: former) }
                return Refusal(thread: thread.name ?? "a thread", cpus: cpus, error: error)
            }
            moved.append((thread, former))
        }
        return nil
    }
}
