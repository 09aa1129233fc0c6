import CLinuxShims
import SignalingSupport
import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

/// The subscriber connections, indexed by subscriber number, and the epoll set they are
/// registered in (token = subscriber number). Built by `SubscriberConnector` on the main
/// thread, then handed whole to the receiver thread: one thread at a time uses it, and
/// thread start and join order those uses.
final class SubscriberTable: @unchecked Sendable {
    let epoll: Epoll
    /// -1 for a subscriber without a connection.
    var descriptors: [Int32]
    /// The bytes of a packet that has not fully arrived, per connection (usually empty).
    var partial: [PartialInput]
    /// One read's worth of bytes.
    let scratch: UnsafeMutableRawBufferPointer
    let dialect: any Dialect
    let clock = SystemClock()

    init(count: Int, dialect: any Dialect) throws(ProbeError) {
        do {
            epoll = try Epoll(capacity: 1024)
        } catch {
            throw ProbeError("\(error)")
        }
        descriptors = [Int32](repeating: -1, count: count)
        partial = [PartialInput](repeating: PartialInput(), count: count)
        scratch = .allocate(byteCount: 256 * 1024, alignment: 8)
        self.dialect = dialect
    }

    deinit {
        for fd in descriptors where fd >= 0 { close(fd) }
        scratch.deallocate()
    }

    var count: Int { descriptors.count }

    /// What one read on a connection gave.
    enum ReadOutcome {
        /// Nothing to read after all.
        case nothing
        /// Bytes arrived: the kernel received them at `arrived` (its receive timestamp, 0
        /// when it gave none) and this process had read them at `read` (both
        /// CLOCK_REALTIME ns, the clock of the send stamps). Their packets are in the
        /// `Inbound`, and any reply was sent.
        case received(arrived: UInt64, read: UInt64)
        /// The connection is unusable (closed by the server, refused, malformed).
        case failed(String)
    }

    /// One recv on subscriber `index`'s connection, then parsing, then the reply.
    func read(_ index: Int, into inbound: inout Inbound) -> ReadOutcome {
        let fd = descriptors[index]
        var arrivedAt: UInt64 = 0
        let result = SystemCall.io { Int(voipload_read_stamped(fd, scratch.baseAddress, UInt(scratch.count), &arrivedAt)) }
        let readAt = voipload_realtime_ns()
        let count: Int
        switch result {
        case .transferred(0): return .failed("the server closed the connection")
        case .transferred(let moved): count = moved
        case .wouldBlock: return .nothing
        case .failed(let code): return .failed(ProbeError(call: "recv", code: code).message)
        }
        inbound.reset()
        let arrived = UnsafeRawBufferPointer(rebasing: scratch[0..<Int(count)])
        partial[index].consume(arrived, dialect: dialect, subscriber: index, into: &inbound)
        if let problem = inbound.problem { return .failed(problem) }
        if !inbound.reply.isEmpty && !Sockets.sendAll(fd, inbound.reply) {
            return .failed(ProbeError(call: "send").message)
        }
        return .received(arrived: arrivedAt, read: readAt)
    }

    /// Closes subscriber `index`'s connection (which also takes it out of the epoll set).
    func drop(_ index: Int) {
        guard descriptors[index] >= 0 else { return }
        close(descriptors[index])
        descriptors[index] = -1
        partial[index] = PartialInput()
    }
}
