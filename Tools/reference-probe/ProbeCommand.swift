import VoipLoadKit
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Runs one measurement: subscribers, memory, publisher and receiver threads, report.
enum ProbeCommand {
    static func main(_ arguments: [String]) -> Int32 {
        if (try? ProbeOptions.parser.parse(arguments))?.versionRequested == true {
            StandardStreams.output(ProductVersion.line(for: "reference-probe"))
            return 0
        }
        let options: ProbeOptions
        do {
            guard let parsed = try ProbeOptions.parse(arguments) else {
                StandardStreams.output(ProbeOptions.parser.helpText)
                return 0
            }
            options = parsed
        } catch {
            StandardStreams.error("reference-probe: \(error)\nTry 'reference-probe --help'.\n")
            return 64
        }
        signal(SIGPIPE, SIG_IGN)
        do {
            let reports = try run(options)
            for report in reports { StandardStreams.output(report.text()) }
            return reports.allSatisfy(\.clean) ? 0 : 1
        } catch {
            StandardStreams.error("reference-probe: \(error)\n")
            return 2
        }
    }

    /// The measurement: one report, or with `--turns` one per pacing.
    static func run(_ options: ProbeOptions) throws(ProbeError) -> [ProbeReport] {
        let limit = Int(clamping: SocketCalls.raiseDescriptorLimit())
        guard options.subscribers + 64 <= limit else {
            throw ProbeError("\(options.subscribers) subscribers need more file descriptors than the limit of \(limit)")
        }
        let dialect: any Dialect = options.wireProtocol == .mqtt ? MQTTDialect() : VoipDialect()
        let server = SocketCalls.socketAddress(options.server.address, port: options.server.port)
        let table = try SubscriberTable(count: options.subscribers, dialect: dialect)

        let rssBefore = options.serverPID.flatMap { ProcessStats.residentBytes(pid: $0) }
        let connector = SubscriberConnector(server: server, sources: options.sources, maxInFlight: options.maxInFlight)
        let overflowsBefore = ListenOverflows.current()
        var connect = connector.connectAll(table)
        if let before = overflowsBefore, let after = ListenOverflows.current() {
            connect.listenOverflows = after >= before ? after - before : 0
        }
        guard connect.established > 0 else {
            throw ProbeError("no subscriber could connect (\(connect.firstFailure ?? "no reason recorded"))")
        }
        usleep(UInt32(options.settleSeconds * 1_000_000))
        let rssAfter = options.serverPID.flatMap { ProcessStats.residentBytes(pid: $0) }

        let publisherServer = SocketCalls.socketAddress(options.publisherServer.address, port: options.publisherServer.port)
        let publisherFD = try connectPublisher(to: publisherServer, dialect: dialect)
        defer { close(publisherFD) }

        func report(_ turns: Turns, closedLoop: Bool, rate: Double, events: Int) -> ProbeReport {
            var options = options
            (options.closedLoop, options.rate, options.events) = (closedLoop, rate, events)
            return ProbeReport(
                options: options, connect: connect, rssBefore: rssBefore, rssAfter: rssAfter,
                publisher: turns.publisher, receiver: turns.receiver, cpu: CPUAccounting.usage(of: turns.cpu))
        }
        guard let paths = options.turns else {
            let once = measure(
                table: table, publisherFD: publisherFD, dialect: dialect, options: options,
                closedLoop: options.closedLoop, rate: options.rate, events: options.events, firstNumber: 0, seed: options.seed)
            return [report(once, closedLoop: options.closedLoop, rate: options.rate, events: options.events)]
        }

        // Turns: one line each, until a line `end` or the end of the file.
        guard let go = fopen(paths.go, "r") else { throw ProbeError(call: "open \(paths.go)", code: errno) }
        defer { fclose(go) }
        var done: Int32 = -1
        if let path = paths.done {
            done = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard done >= 0 else { throw ProbeError(call: "open \(path)", code: errno) }
        }
        defer { if done >= 0 { close(done) } }
        func tell(_ word: String) throws(ProbeError) {
            guard done >= 0 else { return }
            let line = word + "\n"
            let written = line.withCString { write(done, $0, line.utf8.count) }
            guard written == line.utf8.count else { throw ProbeError(call: "write \(paths.done ?? "")", code: errno) }
        }
        try tell("ready")
        // Per pacing, in the order first seen: its turns added up, and their events.
        var pacings: [(closedLoop: Bool, rate: Double, events: Int, turns: Turns)] = []
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        var number: UInt64 = 0
        var sent = 0
        while getline(&line, &capacity, go) > 0, let line {
            var text = String(cString: line)
            while text.last == "\n" || text.last == "\r" { text.removeLast() }
            if text.isEmpty { continue }
            // An explicit end: the script's FIFO may stay open in processes it started since.
            if text == "end" { break }
            let turn: (closedLoop: Bool, rate: Double, events: Int)
            do { turn = try ProbeOptions.turn(text) } catch { throw ProbeError("--turns: \(error)") }
            let measured = measure(
                table: table, publisherFD: publisherFD, dialect: dialect, options: options,
                closedLoop: turn.closedLoop, rate: turn.rate, events: turn.events, firstNumber: sent, seed: options.seed &+ number)
            number += 1
            sent += turn.events
            if let index = pacings.firstIndex(where: { $0.closedLoop == turn.closedLoop && (turn.closedLoop || $0.rate == turn.rate) }) {
                pacings[index].events += turn.events
                pacings[index].turns.add(measured)
            } else {
                pacings.append((turn.closedLoop, turn.rate, turn.events, measured))
            }
            try tell("done")
        }
        return pacings.map { report($0.turns, closedLoop: $0.closedLoop, rate: $0.rate, events: $0.events) }
    }

    /// What one or more runs of the publisher and the receiver measured.
    struct Turns {
        var publisher: Publisher.Outcome
        var receiver: Receiver.Outcome
        var cpu: CPUAccounting.Interval

        mutating func add(_ other: Turns) {
            publisher.add(other.publisher)
            receiver.add(other.receiver)
            cpu = cpu + other.cpu
        }
    }

    /// One run: `events` events from the publisher thread, read by the receiver thread.
    private static func measure(
        table: SubscriberTable, publisherFD: Int32, dialect: any Dialect, options: ProbeOptions,
        closedLoop: Bool, rate: Double, events: Int, firstNumber: Int, seed: UInt64
    ) -> Turns {
        let board = ProgressBoard()
        let receiver = Receiver(
            table: table, board: board, lossTimeoutNanoseconds: UInt64(options.lossTimeoutSeconds * 1e9),
            reportsArrivals: closedLoop)
        let publisher = Publisher(
            fd: publisherFD, dialect: dialect, subscribers: options.subscribers, events: events,
            firstNumber: firstNumber, rate: rate, closedLoop: closedLoop, payloadBytes: options.payloadBytes, seed: seed,
            board: board, replyTimeoutNanoseconds: UInt64(options.lossTimeoutSeconds * 1e9),
            lossTimeoutNanoseconds: UInt64(options.lossTimeoutSeconds * 1e9))
        let received = ResultSlot<Receiver.Outcome>()
        let published = ResultSlot<Publisher.Outcome>()
        let expectsReplies = options.wireProtocol == .voip
        let clock = SystemClock()
        let cpuBefore = CPUAccounting.sample(serverPID: options.serverPID, at: clock.now().nanoseconds)
        let receiverThread = JoinableThread { received.put(receiver.run()) }
        let publisherThread = JoinableThread { published.put(publisher.run(expectsReplies: expectsReplies)) }
        publisherThread.join()
        receiverThread.join()
        let cpuAfter = CPUAccounting.sample(serverPID: options.serverPID, at: clock.now().nanoseconds)
        return Turns(publisher: published.take()!, receiver: received.take()!, cpu: .between(cpuBefore, cpuAfter))
    }

    /// A blocking connection from 127.0.0.1 whose handshake (CONNACK / WELCOME) is done.
    private static func connectPublisher(to server: sockaddr_in, dialect: any Dialect) throws(ProbeError) -> Int32 {
        let fd = try Sockets.openTCP(nonBlocking: false, source: nil)
        try? SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_RCVTIMEO, timeval(tv_sec: 10, tv_usec: 0))
        let error = Sockets.connect(fd, to: server)
        guard error == 0 else {
            close(fd)
            throw ProbeError(call: "publisher: connect", code: error)
        }
        guard Sockets.sendAll(fd, dialect.publisherGreeting()) else {
            close(fd)
            throw ProbeError(call: "publisher: send")
        }
        var received = PartialInput()
        var chunk = [UInt8](repeating: 0, count: 4096)
        var inbound = Inbound()
        while true {
            let count: Int
            switch chunk.withUnsafeMutableBytes({ SocketCalls.receive(fd, into: $0) }) {
            case .transferred(let moved) where moved > 0: count = moved
            case .transferred:
                close(fd)
                throw ProbeError("publisher: the server closed the connection during the handshake")
            case .wouldBlock:
                close(fd)
                throw ProbeError(call: "publisher: handshake", code: EAGAIN)
            case .failed(let code):
                close(fd)
                throw ProbeError(call: "publisher: handshake", code: code)
            }
            inbound.reset()
            chunk.withUnsafeBytes { received.consume(UnsafeRawBufferPointer(rebasing: $0[0..<count]), dialect: dialect, subscriber: nil, into: &inbound) }
            if let problem = inbound.problem {
                close(fd)
                throw ProbeError("publisher: \(problem)")
            }
            if inbound.established { break }
        }
        guard received.isEmpty else {
            close(fd)
            throw ProbeError("publisher: unexpected bytes after the handshake")
        }
        return fd
    }
}
