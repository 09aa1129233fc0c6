import CLinuxShims
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Runs a load test: starts (or finds) the server, starts the worker processes, and
/// drives them through the phases, measuring the server from /proc between them:
///
/// 1. ramp: connect and handshake every idle device (handshake rate);
/// 2. settle, then the server's RSS and the kernel's TCP memory (memory per connection);
/// 3. push latency: probes at the chosen rate to random idle devices;
/// 4. fan-out: messages to one user with many devices, as fast as receipts come back;
/// 5. reconnect storm: drop every connection, or drain and restart the server.
public final class Coordinator {
    let config: LoadConfiguration
    let server: ServerUnderTest
    let progress: ProgressLine
    var workers: [WorkerHandle] = []
    var expectServerExit = false
    let runID: UInt64

    public init(configuration: LoadConfiguration) {
        config = configuration
        if let binary = configuration.serverBinary {
            var endpoint = configuration.serverEndpoint
            if endpoint.port == 0, let port = SocketCalls.freeLoopbackPort() { endpoint.port = port }
            server = ServerUnderTest(
                endpoint: endpoint, binary: binary, authSecret: configuration.authSecret, authKeyFile: configuration.authKeyFile,
                tls: configuration.tls != nil, extraArguments: configuration.serverArguments, logPath: configuration.serverLog)
        } else {
            server = ServerUnderTest(endpoint: configuration.serverEndpoint, pid: configuration.serverPID)
        }
        progress = ProgressLine(enabled: configuration.progress)
        var generator = SystemRandomNumberGenerator()
        runID = generator.next()
    }

    var total: WorkerStatus { WorkerStatus.total(workers.map(\.status)) }

    public func run() throws(LoadError) -> LoadReport {
        signal(SIGPIPE, SIG_IGN)
        if config.probePriority == .realtime && config.events > 0 {
            // Find out now, not after the ramp, whether the workers will be allowed to.
            let error = voipload_set_realtime(1)
            guard error == 0 else {
                throw LoadError("--probe-priority realtime needs SCHED_FIFO, which was refused (\(String(cString: strerror(error)))): run as root, or with CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1")
            }
            _ = voipload_set_realtime(0)
        }
        // A running server answers at once; one the tool starts gets time to come up.
        try server.start(timeoutSeconds: config.serverBinary == nil ? 0 : 30)
        defer {
            for worker in workers { try? worker.send(.quit) }
            for worker in workers where worker.process.waitForExit(timeoutSeconds: 10) == nil {
                worker.process.send(signal: SIGKILL)
            }
            server.stop()
        }
        let rssBefore = server.pid.flatMap(ProcessStats.residentBytes(pid:))
        let socketsBefore = ProcessStats.socketSummary()
        try startWorkers()

        let rampCPUBefore = server.pid.flatMap(ProcessStats.cpuSeconds(pid:))
        let ramp = try rampUp()
        let rampCPU = zip(rampCPUBefore, server.pid.flatMap(ProcessStats.cpuSeconds(pid:))).map { $0.1 - $0.0 }
        try pump(seconds: config.settleSeconds, label: "settling")
        let rssAfter = server.pid.flatMap(ProcessStats.residentBytes(pid:))
        let socketsAfter = ProcessStats.socketSummary()
        let toolRSS = workers.compactMap { ProcessStats.residentBytes(pid: $0.process.pid) }.reduce(0, +)
            + (ProcessStats.residentBytes(pid: getpid()) ?? 0)
        var problems: [String] = []

        let helpersReady = try connectHelpers(problems: &problems)
        let push = helpersReady && config.events > 0 ? try measurePushLatency() : nil
        let fanout = helpersReady && config.fanoutDevices > 0 ? try measureFanout() : nil
        if config.holdSeconds > 0 { try pump(seconds: config.holdSeconds, label: "holding") }
        let storm = config.storm == .none ? nil : try measureStorm()

        let reports = try collectReports()
        var handshakeLatency = LatencyHistogram(), tlsHandshakeLatency = LatencyHistogram()
        for report in reports {
            handshakeLatency.merge(LatencyHistogram(report.handshakeLatency) ?? LatencyHistogram())
            if let tls = report.tlsHandshakeLatency { tlsHandshakeLatency.merge(LatencyHistogram(tls) ?? LatencyHistogram()) }
        }
        let final = WorkerStatus.total(reports.map(\.status))

        let devices = Double(config.idleDevices)
        let memory = LoadReport.Memory(
            serverRSSBefore: rssBefore, serverRSSAfter: rssAfter,
            serverBytesPerConnection: zip(rssBefore, rssAfter).map { (Double($0.1) - Double($0.0)) / devices },
            tcpMemoryPagesBefore: socketsBefore?.tcpMemoryPages, tcpMemoryPagesAfter: socketsAfter?.tcpMemoryPages,
            kernelBytesPerConnection: zip(socketsBefore, socketsAfter).map {
                (Double($0.1.tcpMemoryPages) - Double($0.0.tcpMemoryPages)) * Double(ProcessStats.pageSize) / devices
            },
            tcpSocketsInUse: socketsAfter?.tcpInUse, toolRSS: toolRSS,
            toolBytesPerConnection: Double(toolRSS) / devices)
        let connections = LoadReport.Connections(
            requested: config.idleDevices, connected: ramp.connected, failed: final.idleFailed,
            failureReasons: final.failures, disconnectReasons: final.disconnects,
            rampSeconds: ramp.seconds, handshakesPerSecond: ramp.seconds > 0 ? Double(ramp.connected) / ramp.seconds : 0,
            peakHandshakesPerSecond: ramp.peak, handshakeLatency: LoadReport.Latency(handshakeLatency),
            rampServerCPUSeconds: rampCPU, handshakesPerServerCPUSecond: rampCPU.flatMap { $0 > 0 ? Double(ramp.connected) / $0 : nil })
        let tls = config.tls == nil ? nil : LoadReport.TLS(
            fullHandshakes: final.tlsFullHandshakes, resumedHandshakes: final.tlsResumedHandshakes,
            handshakeLatency: LoadReport.Latency(tlsHandshakeLatency))

        if final.idleFailed > 0 {
            problems.append("\(final.idleFailed) of \(config.idleDevices) devices failed: \(final.failures.summary)")
        } else if ramp.connected < config.idleDevices {
            problems.append("only \(ramp.connected) of \(config.idleDevices) devices connected before the deadline")
        }
        if let push {
            if push.lost > 0 { problems.append("\(push.lost) of \(push.sent) probes lost (not arrived within \(config.lossDeadline) s)") }
            if push.refused > 0 { problems.append("\(push.refused) probes refused by the server") }
            if let refused = push.pushProbesRefused, refused > 0 {
                problems.append("\(refused) probes to devices with no connection refused by the server")
            }
        }
        if let fanout, fanout.lost > 0 {
            problems.append("\(fanout.lost) fan-out events lost (of \(fanout.messages) messages × \(fanout.devices / fanout.users) devices, plus receipts)")
        }
        if let storm, !storm.recovered {
            problems.append("storm: not every device was back within \(Int(config.stormDeadline)) s")
        }
        return LoadReport(
            setup: LoadReport.Setup(
                server: server.address, serverStarted: config.serverBinary != nil, devices: config.idleDevices,
                workers: workers.count, sourceAddresses: config.sourceAddresses, connectRate: config.connectRate,
                maxInFlightPerWorker: config.maxInFlight, payloadBytes: config.payloadBytes),
            connections: connections, memory: memory, push: push, fanout: fanout, storm: storm, tls: tls, problems: problems)
    }

    // MARK: - Phases

    func startWorkers() throws(LoadError) {
        let executable = ChildProcess.currentExecutablePath()
        let count = config.effectiveWorkers
        for index in 0..<count {
            let process: ChildProcess
            do {
                process = try ChildProcess.spawn(executable, arguments: ["worker"], pipeInput: true, stdout: .pipe, stderr: .inherit)
            } catch {
                throw LoadError("cannot start worker process \(executable): \(error.reason)")
            }
            let worker = WorkerHandle(index: index, process: process)
            workers.append(worker)
            try worker.send(.setup(WorkerSetup(
                worker: index, workerCount: count,
                // A started server's port may have been chosen here: it is the one server then.
                servers: config.serverBinary != nil ? [LoopbackEndpoint(server.endpoint)] : config.serverEndpoints,
                authSecret: config.authSecret,
                tokenKeyID: config.tokenKey?.id, tokenKeySecret: config.tokenKey?.secret, requestedKeepAlive: config.keepAlive,
                idleDevices: config.idleDevices, fanoutDevices: config.fanoutDevices, fanoutUsers: config.fanoutUsers,
                sourceAddresses: config.sourceAddresses, connectRate: config.connectRate / Double(count),
                maxInFlight: config.maxInFlight, connectTimeoutSeconds: config.connectTimeout,
                payloadBytes: config.payloadBytes, runID: runID, probePriority: config.probePriority, tls: config.tls,
                callAnswer: config.callAnswer, pushUsers: config.pushUsers)))
        }
    }

    struct RampResult {
        var connected: Int
        var seconds: Double
        var peak: Double
    }

    func rampUp() throws(LoadError) -> RampResult {
        try broadcast(.connect(.idle))
        let start = monotonicSeconds()
        var tracker = RateTracker()
        var finishedAt = start
        let expected = config.connectRate > 0 ? Double(config.idleDevices) / config.connectRate : 0
        let limit = config.connectTimeout + expected + 10
        try pump(label: "connecting", timeout: limit, until: { [self] in
            let total = self.total
            tracker.sample(time: monotonicSeconds(), count: total.handshakes)
            if total.idleConnected < config.idleDevices { finishedAt = monotonicSeconds() }
            return total.idleConnected + total.idleFailed >= config.idleDevices
        }, describe: { [self] total, elapsed in
            "connecting: \(total.idleConnected)/\(config.idleDevices) devices, \(Int(Double(total.handshakes) / max(elapsed, 0.001)))/s, \(total.inFlight) in flight, \(total.idleFailed) failed"
        })
        tracker.sample(time: finishedAt + tracker.resolution, count: total.handshakes)
        let connected = total.idleConnected
        if connected == 0 {
            let why = total.failures.isEmpty ? total.disconnects.summary : total.failures.summary
            throw LoadError("no device could connect to \(server.address): \(why)")
        }
        let seconds = max(finishedAt - start, 1e-3)
        // A ramp shorter than the one-second window has no peak apart from its average.
        let peak = seconds < 1 ? Double(connected) / seconds : tracker.peakRate()
        return RampResult(connected: connected, seconds: seconds, peak: peak)
    }

    /// The probe senders and, for the fan-out test, the fan-out user's devices.
    func connectHelpers(problems: inout [String]) throws(LoadError) -> Bool {
        guard config.events > 0 || config.fanoutDevices > 0 else { return false }
        try broadcast(.connect(.senders))
        if config.fanoutDevices > 0 { try broadcast(.connect(.fanout)) }
        let senders = 2 * workers.count
        let ready = try pump(label: "connecting senders", timeout: config.connectTimeout + 10, until: { [self] in
            let total = self.total
            return total.sendersConnected == senders && total.fanoutConnected == config.fanoutDevices
        }, describe: { [self] total, _ in
            "connecting senders: \(total.sendersConnected)/\(senders), fan-out devices \(total.fanoutConnected)/\(config.fanoutDevices)"
        })
        if !ready {
            problems.append("the senders and fan-out devices did not all connect: \(total.failures.summary)")
        }
        return ready
    }

    func measurePushLatency() throws(LoadError) -> LoadReport.Push {
        let before = total
        let cpuBefore = server.pid.flatMap(ProcessStats.cpuSeconds(pid:))
        for worker in workers {
            let count = WorkloadLayout.share(of: config.events, worker: worker.index, workers: workers.count)
            try worker.send(.probe(count: count, rate: config.rate / Double(workers.count), mix: config.mix))
            worker.status.probesDone = count == 0
        }
        let sendTime = Double(config.events) / config.rate
        try pump(label: "push latency", timeout: sendTime + 30, until: { [self] in self.total.probesDone }, describe: { [self] total, _ in
            "push latency: sent \(total.probesSent - before.probesSent)/\(config.events), received \(total.probesReceived - before.probesReceived)"
        })
        try pump(label: "waiting for the last probes", timeout: config.lossDeadline, until: { [self] in
            let total = self.total
            return total.probesReceived + total.probesRefused >= total.probesSent
                && total.probeReceipts + total.callsEnded + total.callsAnswered >= total.probesAccepted
                && total.pushProbesAccepted + total.pushProbesRefused >= total.pushProbesSent
        }, describe: nil)
        let reports = try collectReports()
        var message = LatencyHistogram(), call = LatencyHistogram(), read = LatencyHistogram()
        for report in reports {
            message.merge(LatencyHistogram(report.messageLatency) ?? LatencyHistogram())
            call.merge(LatencyHistogram(report.callLatency) ?? LatencyHistogram())
            read.merge(LatencyHistogram(report.readLatency) ?? LatencyHistogram())
        }
        var all = message
        all.merge(call)
        let after = WorkerStatus.total(reports.map(\.status))
        if config.probePriority == .realtime && after.realtimeWorkers < workers.count {
            throw LoadError("only \(after.realtimeWorkers) of \(workers.count) workers ran the probes at SCHED_FIFO")
        }
        let sent = after.probesSent - before.probesSent
        let refused = after.probesRefused - before.probesRefused
        let received = after.probesReceived - before.probesReceived
        let cpu = zip(cpuBefore, server.pid.flatMap(ProcessStats.cpuSeconds(pid:))).map { $0.1 - $0.0 }
        return LoadReport.Push(
            requested: config.events, rate: config.rate, mix: config.mix.rawValue,
            priority: config.probePriority.rawValue, sent: sent,
            accepted: after.probesAccepted - before.probesAccepted, refused: refused, received: received,
            lost: sent > received + refused ? sent - received - refused : 0,
            duplicates: after.duplicates - before.duplicates, receipts: after.probeReceipts - before.probeReceipts,
            callsEnded: after.callsEnded - before.callsEnded,
            serverCPUMicrosPerProbe: cpu.flatMap { sent > 0 ? $0 * 1e6 / Double(sent) : nil },
            latency: LoadReport.Latency(all),
            messageLatency: LoadReport.Latency(message), callLatency: LoadReport.Latency(call),
            readLatency: LoadReport.Latency(read), unstampedEvents: after.unstampedEvents - before.unstampedEvents,
            callsAnswered: config.callAnswer == .accept ? after.callsAnswered - before.callsAnswered : nil,
            pushProbes: config.pushUsers > 0 ? after.pushProbesSent - before.pushProbesSent : nil,
            pushProbesRefused: config.pushUsers > 0 ? after.pushProbesRefused - before.pushProbesRefused : nil)
    }

    func measureFanout() throws(LoadError) -> LoadReport.Fanout {
        let before = total
        // Every message goes to one fan-out user's devices.
        let devices = UInt64(config.fanoutDevices / config.fanoutUsers)
        let cpuBefore = server.pid.flatMap(ProcessStats.cpuSeconds(pid:))
        let start = monotonicSeconds()
        try broadcast(.startFanout(window: config.fanoutWindow))
        try pump(seconds: config.fanoutSeconds, label: "fan-out") { total, elapsed in
            "fan-out: \(Int(Double(total.fanoutDelivered - before.fanoutDelivered + total.fanoutReceipts - before.fanoutReceipts) / max(elapsed, 0.001))) events/s"
        }
        try broadcast(.stopFanout)
        var finishedAt = monotonicSeconds()
        try pump(label: "fan-out drain", timeout: config.lossDeadline, until: { [self] in
            let total = self.total
            let expected = (total.fanoutSent - before.fanoutSent) * devices
            let done = total.fanoutDelivered - before.fanoutDelivered >= expected
                && total.fanoutReceipts - before.fanoutReceipts >= expected
            if !done { finishedAt = monotonicSeconds() }
            return done
        }, describe: nil)
        let cpuAfter = server.pid.flatMap(ProcessStats.cpuSeconds(pid:))
        let reports = try collectReports()
        var latency = LatencyHistogram()
        for report in reports { latency.merge(LatencyHistogram(report.fanoutLatency) ?? LatencyHistogram()) }
        let after = WorkerStatus.total(reports.map(\.status))
        let messages = after.fanoutSent - before.fanoutSent
        let delivered = after.fanoutDelivered - before.fanoutDelivered
        let receipts = after.fanoutReceipts - before.fanoutReceipts
        let seconds = max(finishedAt - start, 1e-3)
        let cpu = zip(cpuBefore, cpuAfter).map { $0.1 - $0.0 }
        let expected = 2 * messages * devices
        return LoadReport.Fanout(
            devices: config.fanoutDevices, users: config.fanoutUsers, senders: workers.count, seconds: seconds, messages: messages,
            delivered: delivered, receipts: receipts,
            lost: expected > delivered + receipts ? expected - delivered - receipts : 0,
            serverCPUSeconds: cpu, eventsPerSecond: Double(delivered + receipts) / seconds,
            eventsPerCPUSecond: cpu.flatMap { $0 > 0 ? Double(delivered + receipts) / $0 : nil },
            latency: LoadReport.Latency(latency))
    }

    func measureStorm() throws(LoadError) -> LoadReport.Storm {
        let before = total
        let start = monotonicSeconds()
        var serverDown: Double?
        var tracker = RateTracker()
        switch config.storm {
        case .none:
            break
        case .drop:
            try broadcast(.dropConnections)
        case .restart:
            expectServerExit = true
            server.beginDrain()
            try pump(label: "server draining", timeout: 60, until: { [self] in server.hasExited }, describe: nil)
            guard server.hasExited else { throw LoadError("the server did not exit within 60 s of SIGTERM") }
            try server.launch()
            expectServerExit = false
        }
        var finishedAt = start
        // Every device connected before the storm must handshake again: until then a
        // device that has not noticed the storm yet still looks connected.
        let devicesToReturn = UInt64(before.idleConnected)
        let recovered = try pump(label: "storm", timeout: config.stormDeadline, until: { [self] in
            let total = self.total
            let now = monotonicSeconds()
            tracker.sample(time: now, count: total.handshakes)
            if serverDown == nil && config.storm == .restart && total.handshakes > before.handshakes {
                serverDown = now - start
            }
            let back = total.idleHandshakes - before.idleHandshakes >= devicesToReturn
                && total.idleConnected + total.idleFailed >= config.idleDevices
            if !back { finishedAt = now }
            return back
        }, describe: { [self] total, elapsed in
            "storm: \(total.idleConnected)/\(config.idleDevices) back after \(String(format: "%.1f", elapsed)) s, \(total.handshakes - before.handshakes) handshakes"
        })
        let after = total
        return LoadReport.Storm(
            kind: config.storm.rawValue, devices: config.idleDevices, recovered: recovered && after.idleFailed == before.idleFailed,
            recoverySeconds: finishedAt - start, serverDownSeconds: serverDown,
            handshakes: after.handshakes - before.handshakes, resumed: after.resumed - before.resumed,
            peakHandshakesPerSecond: tracker.peakRate(),
            disconnectReasons: after.disconnects.growth(since: before.disconnects),
            tlsFullHandshakes: config.tls == nil ? nil : after.tlsFullHandshakes - before.tlsFullHandshakes,
            tlsResumedHandshakes: config.tls == nil ? nil : after.tlsResumedHandshakes - before.tlsResumedHandshakes)
    }

    func collectReports() throws(LoadError) -> [WorkerReport] {
        for worker in workers { worker.report = nil }
        try broadcast(.report)
        try pump(label: "collecting", timeout: 30, until: { [self] in workers.allSatisfy { $0.report != nil } }, describe: nil)
        let reports = workers.compactMap(\.report)
        guard reports.count == workers.count else { throw LoadError("a worker did not answer with its report") }
        return reports
    }

    // MARK: - Plumbing

    func broadcast(_ command: WorkerCommand) throws(LoadError) {
        for worker in workers { try worker.send(command) }
    }

    /// Keeps reading the workers for `seconds` (a measured wait, not a guess: the settle
    /// time and the fan-out duration are part of the method).
    func pump(seconds: Double, label: String, describe: ((WorkerStatus, Double) -> String)? = nil) throws(LoadError) {
        let end = monotonicSeconds() + seconds
        try pump(label: label, timeout: seconds, until: { monotonicSeconds() >= end }, describe: describe)
    }

    /// Reads the workers until `condition` holds or `timeout` passes; true if it held.
    @discardableResult
    func pump(
        label: String, timeout: Double, until condition: () -> Bool,
        describe: ((WorkerStatus, Double) -> String)?
    ) throws(LoadError) -> Bool {
        let start = monotonicSeconds()
        let deadline = start + timeout
        defer { progress.finish() }
        var descriptors = workers.map { pollfd(fd: $0.process.output, events: Int16(POLLIN), revents: 0) }
        while true {
            if condition() { return true }
            let now = monotonicSeconds()
            if now >= deadline { return false }
            if let describe { progress.show(describe(total, now - start)) }
            if !expectServerExit, let how = server.exitedUnexpectedly {
                throw LoadError("the server exited during the run (\(how))")
            }
            let wait = Int32(min(50, max(1, (deadline - now) * 1000)))
            let ready = poll(&descriptors, nfds_t(descriptors.count), wait)
            if ready < 0 && errno != EINTR { throw LoadError("poll: \(SystemError("poll", errno).reason)") }
            for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
                try workers[index].readAvailable()
                descriptors[index].revents = 0
            }
        }
    }
}

/// A single status line on stderr, redrawn in place on a terminal and printed about once
/// a second otherwise (so logs of a benchmark stay short).
final class ProgressLine {
    let enabled: Bool
    let isTerminal = isatty(2) != 0
    private var lastPrinted = 0.0
    private var shown = false

    init(enabled: Bool) { self.enabled = enabled }

    func show(_ text: String) {
        guard enabled else { return }
        let now = monotonicSeconds()
        if isTerminal {
            guard now - lastPrinted >= 0.1 else { return }
            write("\r\u{1B}[K" + text)
            shown = true
        } else {
            guard now - lastPrinted >= 1 else { return }
            write(text + "\n")
        }
        lastPrinted = now
    }

    func finish() {
        if shown { write("\r\u{1B}[K") }
        shown = false
        lastPrinted = 0
    }

    private func write(_ text: String) {
        var bytes = Array(text.utf8)
        _ = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress, $0.count) }
    }
}

func zip<A, B>(_ a: A?, _ b: B?) -> (A, B)? {
    guard let a, let b else { return nil }
    return (a, b)
}
