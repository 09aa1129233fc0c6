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
            let report = try run(options)
            StandardStreams.output(report.text())
            return report.clean ? 0 : 1
        } catch {
            StandardStreams.error("reference-probe: \(error)\n")
            return 2
        }
    }

    static func run(_ options: ProbeOptions) throws(ProbeError) -> ProbeReport {
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

        let board = ProgressBoard()
        let receiver = Receiver(
            table: table, board: board, lossTimeoutNanoseconds: UInt64(options.lossTimeoutSeconds * 1e9),
            reportsArrivals: options.closedLoop)
        let publisher = Publisher(
            fd: publisherFD, dialect: dialect, subscribers: options.subscribers, events: options.events,
            rate: options.rate, closedLoop: options.closedLoop, payloadBytes: options.payloadBytes, seed: options.seed,
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

        return ProbeReport(
            options: options, connect: connect, rssBefore: rssBefore, rssAfter: rssAfter,
            publisher: published.take()!, receiver: received.take()!,
            cpu: CPUAccounting.usage(from: cpuBefore, to: cpuAfter))
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
