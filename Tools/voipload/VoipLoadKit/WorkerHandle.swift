#if canImport(Glibc)
import SignalingSupport
import Glibc
#endif

/// The coordinator's side of one worker process: its pipes and what it last said.
final class WorkerHandle {
    let index: Int
    let process: ChildProcess
    var status = WorkerStatus()
    var report: WorkerReport?
    private var lines = LineBuffer()

    init(index: Int, process: ChildProcess) {
        self.index = index
        self.process = process
        status.worker = index
        status.probesDone = true
    }

    func send(_ command: WorkerCommand) throws(LoadError) {
        let bytes = WorkerLine.encode(command)
        let ok = bytes.withUnsafeBytes { buffer -> Bool in
            var offset = 0
            while offset < buffer.count {
                let written = write(process.input, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += written
            }
            return true
        }
        guard ok else { throw exited() }
    }

    /// Reads what the worker wrote and applies it; throws if the worker failed or exited.
    func readAvailable() throws(LoadError) {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let count = chunk.withUnsafeMutableBytes { read(process.output, $0.baseAddress, $0.count) }
        if count == 0 { throw exited() }
        guard count > 0 else { return }
        for line in lines.append(chunk[0..<count]) {
            guard let event = WorkerLine.decode(WorkerEvent.self, from: line) else {
                throw LoadError("worker \(index) wrote an unreadable line: \(String(decoding: line.prefix(200), as: UTF8.self))")
            }
            switch event {
            case .status(let status): self.status = status
            case .report(let report):
                self.report = report
                status = report.status
            case .fatal(let message): throw LoadError(message)
            }
        }
    }

    private func exited() -> LoadError {
        let status = process.waitForExit(timeoutSeconds: 2)
        return LoadError("worker \(index) exited unexpectedly (\(status.map(ChildProcess.describe(status:)) ?? "still running"))")
    }
}
