import CLinuxShims
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// The `voipload worker` subcommand: started by the coordinator, never by hand.
public enum WorkerMain {
    /// Descriptors a worker keeps for itself (stdio, epoll, /proc reads).
    static let reservedDescriptors = 32

    public static func run() -> Int32 {
        // A worker must never outlive its coordinator, even one killed with SIGKILL.
        _ = voipload_set_parent_death_signal(SIGKILL)
        // Probes go out on their schedule to the microsecond, not up to 50 µs late.
        _ = voipload_set_timer_slack(1)
        signal(SIGPIPE, SIG_IGN)
        guard let setup = readSetup() else {
            fail("worker: expected a setup command on stdin (this subcommand is started by voipload itself)")
            return 70
        }
        let limit = SocketCalls.raiseDescriptorLimit()
        let layout = WorkloadLayout(
            worker: setup.worker, workerCount: setup.workerCount, idleDevices: setup.idleDevices,
            fanoutDevices: setup.fanoutDevices, fanoutUsers: setup.fanoutUsers, sourceAddresses: setup.sourceAddresses)
        guard UInt64(layout.slotCount + reservedDescriptors) <= limit else {
            fail("worker \(setup.worker): \(layout.slotCount) connections need more than the \(limit) file descriptors a process may hold; use more --workers")
            return 70
        }
        var tlsContext: TLSClientContext?
        if let tls = setup.tls {
            do {
                tlsContext = try tls.makeContext()
            } catch {
                fail("worker \(setup.worker): TLS: \(error.message)")
                return 70
            }
        }
        do {
            let worker = try LoadWorker(setup: setup, tlsContext: tlsContext)
            worker.run()
            return 0
        } catch {
            fail("worker \(setup.worker): \(error)")
            return 70
        }
    }

    /// Reads stdin byte by byte up to the first newline, so nothing after the setup line
    /// is consumed before the worker's own loop reads the rest.
    static func readSetup() -> WorkerSetup? {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(0, &byte, 1) == 1 {
            if byte == UInt8(ascii: "\n") { break }
            line.append(byte)
        }
        guard case .setup(let setup)? = WorkerLine.decode(WorkerCommand.self, from: line) else { return nil }
        return setup
    }

    static func fail(_ message: String) {
        let bytes = WorkerLine.encode(WorkerEvent.fatal(message))
        _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
    }
}
