import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `--thread-placement`: the plan (a pure function of the configuration and the CPUs the
/// process may use), the pins, and what a server does with a refusal. The executable's
/// real placement, read back from /proc: `VoipServerExecutableTests`.
@Suite("Thread placement: loops on CPUs of their own, the store's threads on the others")
struct ThreadPlacementTests {
    func plan(
        _ mode: ThreadPlacementMode = .auto, loopCPUs: [Int] = [], allowed: [Int], loops: Int, durable: Bool = true
    ) -> ThreadPlacement {
        ThreadPlacement.plan(mode: mode, loopCPUs: loopCPUs, allowed: allowed, loops: loops, durableStore: durable)
    }

    @Test("auto with a store: loop i on the i-th allowed CPU, the store's threads on the rest")
    func autoSpreadsLoopsAndStore() {
        #expect(plan(allowed: [0, 1], loops: 1) == ThreadPlacement(source: .auto, loops: [0], store: [1]))
        #expect(plan(allowed: [0, 1, 2, 3], loops: 1) == ThreadPlacement(source: .auto, loops: [0], store: [1, 2, 3]))
        #expect(plan(allowed: [0, 1, 2, 3], loops: 3) == ThreadPlacement(source: .auto, loops: [0, 1, 2], store: [3]))
        // A narrowed mask (taskset -c 2,5,7; a cpuset) is respected: only its CPUs are used.
        #expect(plan(allowed: [2, 5, 7], loops: 1) == ThreadPlacement(source: .auto, loops: [2], store: [5, 7]))
        #expect(plan(allowed: Array(0..<16), loops: 15) == ThreadPlacement(source: .auto, loops: Array(0..<15), store: [15]))
    }

    @Test("auto places nothing without a CPU to spare or without a store")
    func autoNeedsSpareCPUsAndAStore() {
        for (allowed, loops) in [([0], 1), ([0, 1], 2), ([0, 1], 3), ([4, 6], 2)] {
            let placement = plan(allowed: allowed, loops: loops)
            #expect(placement.source == .none && placement.loops.isEmpty && placement.store.isEmpty, "\(allowed) \(loops)")
            #expect(placement.detail?.contains("no CPU to spare") == true, "\(String(describing: placement.detail))")
        }
        let memory = plan(allowed: [0, 1, 2, 3], loops: 1, durable: false)
        #expect(memory.source == .none && memory.loops.isEmpty && memory.store.isEmpty)
    }

    @Test("off places nothing; --loop-cpus wins over auto and moves only the loops")
    func offAndLoopCPUs() {
        #expect(plan(.off, allowed: [0, 1, 2, 3], loops: 1) == ThreadPlacement(source: .off, loops: [], store: []))
        for mode in ThreadPlacementMode.allCases {
            #expect(plan(mode, loopCPUs: [3, 0], allowed: [0, 1, 2, 3], loops: 3)
                == ThreadPlacement(source: .loopCPUs, loops: [3, 0, 3], store: []))
        }
    }

    @Test("off is the default of the library and of voipserver (auto cost more than it saved on a quiet host); the option and the file key set it")
    func defaultIsOff() throws {
        #expect(ServerConfiguration().threadPlacement == .off)
        #expect(try ServerOptions.configuration(from: []).0.threadPlacement == .off)
        #expect(try ServerOptions.configuration(from: ["--thread-placement", "auto"]).0.threadPlacement == .auto)
        #expect(try ServerOptions.configuration(from: ["--thread-placement", "off"]).0.threadPlacement == .off)
        let path = "/tmp/voipserver-placement-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, "thread-placement = auto\n"))
        defer { removeFile(path) }
        #expect(try ServerOptions.configuration(from: ["--config", path]).0.threadPlacement == .auto)
        #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--thread-placement", "on"]) }
    }

    @Test("the report names every loop and store thread with its CPUs, any where unplaced")
    func report() throws {
        let placed = ThreadPlacement(source: .auto, loops: [0, 1], store: [2, 3, 5])
        #expect(placed.threads(loopCount: 2, storeThreads: ["vs-store", "vs-checkpoint"]).map { "\($0.thread):\($0.cpus)" }
            == ["vs-loop-0:0", "vs-loop-1:1", "vs-store:2-3,5", "vs-checkpoint:2-3,5"])
        let unplaced = ThreadPlacement(source: .off, loops: [], store: [])
        #expect(unplaced.threads(loopCount: 1, storeThreads: ["vs-store"]).map { "\($0.thread):\($0.cpus)" }
            == ["vs-loop-0:any", "vs-store:any"])
        #expect(CPUList.format([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9")
        #expect(CPUList.format([]) == "" && CPUList.format([7]) == "7")
        #expect(try CPUList.parse(CPUList.format(CPUList.allowed())) == CPUList.allowed())
    }

    /// A thread that sleeps until `stop` is signalled, to pin and read back.
    final class IdleThread {
        final class Flag: Sendable { let done = Atomic<Bool>(false) }
        private let flag = Flag()
        let thread: JoinableThread
        init(name: String) {
            thread = JoinableThread(name: name) { [flag] in
                while !flag.done.load(ordering: .acquiring) { usleep(1_000) }
            }
        }
        func stop() {
            flag.done.store(true, ordering: .releasing)
            thread.join()
        }
    }

    @Test("pins take; at a refusal the threads already moved get their masks back")
    func pinsAndRefusal() {
        let allowed = CPUList.allowed()
        let first = IdleThread(name: "placed-a"), second = IdleThread(name: "placed-b")
        defer { first.stop(); second.stop() }
        #expect(ThreadPlacement.pin([(first.thread, [allowed[0]])]) == nil)
        #expect(first.thread.allowedCPUs == [allowed[0]])
        _ = first.thread.pin(toCPUs: allowed)

        // A CPU the machine does not have: the kernel refuses (EINVAL), and the first
        // thread, already moved, is put back.
        let missing = CPUList.configuredCount
        let refusal = ThreadPlacement.pin([(first.thread, [allowed[0]]), (second.thread, [missing])])
        #expect(refusal == ThreadPlacement.Refusal(thread: "placed-b", cpus: [missing], error: EINVAL))
        #expect(first.thread.allowedCPUs == allowed && second.thread.allowedCPUs == allowed)
    }

    @Test("a refused automatic placement logs one warning, and the server runs with its threads unplaced")
    func refusedPlacementWarnsAndRuns() throws {
        let log = LogFile()
        // The loop's CPU exists, the store's does not: the loop is moved, then put back.
        let allowed = CPUList.allowed()
        let test = try TestServer(
            workers: 1, store: ModelEventStore(), logger: log.logger, allowedCPUs: [allowed[0], CPUList.configuredCount]
        ) { $0.threadPlacement = .auto }
        let server = test.server
        let warnings = log.lines("thread_placement_refused")
        #expect(warnings.count == 1, "\(warnings)")
        #expect(warnings.first?.contains("thread=vs-store cpus=\(CPUList.configuredCount) ") == true, "\(warnings)")
        #expect(server.threadPlacement.source == .refused)
        #expect(server.threadPlacement.threads.map { "\($0.thread):\($0.cpus)" } == ["vs-loop-0:any", "vs-store:any"])
        #expect(server.loopThreadCPUs == [allowed], "the loop keeps the process's CPUs")
        #expect(log.lines("thread_placement").first?.contains("placement=refused") == true)

        _ = try test.connect(user: "alice")
    }

    @Test("--loop-slice: each loop thread asks the kernel for that slice and the listening line says so; by default the kernel's own; outside 100-100000 µs refused")
    func loopSlice() throws {
        #expect(ServerConfiguration().loopSlice == .zero)
        #expect(try ServerOptions.configuration(from: ["--loop-slice", "150"]).0.loopSlice == .microseconds(150))
        #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--loop-slice", "99"]) }
        #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--loop-slice", "100001"]) }

        let log = LogFile()
        let sliced = try TestServer(workers: 2, logger: log.logger) { $0.loopSlice = .microseconds(150) }
        if JoinableThread.keepsSlicePerThread {
            #expect(sliced.server.loopThreadSlices == [.microseconds(150), .microseconds(150)])
            #expect(log.lines("listening").first?.contains("loop_slice=150us") == true)
        } else {
            // Before Linux 6.12 the request is ignored: one warning, and the default.
            #expect(log.lines("loop_slice_ignored").count == 1)
            #expect(log.lines("listening").first?.contains("loop_slice=default") == true)
        }
        let plain = try TestServer(workers: 2)
        #expect(plain.server.loopThreadSlices.count == 2 && plain.server.loopThreadSlices.allSatisfy { $0 != nil && $0 != .microseconds(150) })
    }

    @Test("a server with a store pins its loop and writer in auto, and nothing when off")
    func serverPlacesItsThreads() throws {
        let allowed = CPUList.allowed()
        for mode in ThreadPlacementMode.allCases {
            let log = LogFile()
            // Two CPUs whatever the machine: the first allowed one, and the first again for
            // the store (a CPU may be named twice in a plan's input; it is still "a spare").
            let test = try TestServer(
                workers: 1, store: ModelEventStore(), logger: log.logger,
                allowedCPUs: allowed.count >= 2 ? Array(allowed.prefix(2)) : [allowed[0], allowed[0]]
            ) { $0.threadPlacement = mode }
            let server = test.server
            switch mode {
            case .auto:
                #expect(server.threadPlacement.source == .auto)
                #expect(server.loopThreadCPUs == [[allowed[0]]])
                #expect(server.threadPlacement.threads.map { "\($0.thread):\($0.cpus)" }
                    == ["vs-loop-0:\(allowed[0])", "vs-store:\(allowed.count >= 2 ? allowed[1] : allowed[0])"])
                #expect(log.lines("listening").first?.contains("loop_cpus=\(allowed[0])") == true)
            case .off:
                #expect(server.threadPlacement.source == .off)
                #expect(server.loopThreadCPUs == [allowed])
                #expect(log.lines("listening").first?.contains("loop_cpus=any") == true)
            }
            #expect(log.lines("thread_placement_refused").isEmpty)
        }
    }
}
