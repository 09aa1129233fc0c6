import CLinuxShims
import VoipLoadKit
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Opens every subscriber connection and completes its handshake, with at most
/// `maxInFlight` handshakes under way at once so the server is never flooded, spreading
/// the connections over several loopback source addresses (ephemeral ports are per
/// source address). A failed attempt is retried, up to `attempts` tries per subscriber.
struct SubscriberConnector {
    var server: sockaddr_in
    var sources: [UInt32]
    var maxInFlight: Int
    var attempts = 3
    var handshakeTimeoutNanoseconds: UInt64 = 15_000_000_000

    struct Outcome {
        var established = 0
        var failed = 0
        var retries = 0
        var seconds = 0.0
        var firstFailure: String?
        /// SYNs the kernel dropped meanwhile because an accept queue was full (nil: unknown).
        var listenOverflows: UInt64?
        var handshakesPerSecond: Double { seconds > 0 ? Double(established) / seconds : 0 }
    }

    private enum Stage: UInt8 { case waiting, connecting, greeted, established, failed }

    func connectAll(_ table: SubscriberTable) -> Outcome {
        let clock = table.clock
        let count = table.count
        var stage = [Stage](repeating: .waiting, count: count)
        var tries = [UInt8](repeating: 0, count: count)
        var startedAt = [UInt64](repeating: 0, count: count)
        var retryQueue: [Int] = []
        var next = 0
        var inFlight = 0
        var outcome = Outcome()
        var inbound = Inbound()
        let start = clock.now().nanoseconds
        var lastTimeoutScan = start

        func fail(_ index: Int, _ reason: String) {
            table.drop(index)
            inFlight -= 1
            if Int(tries[index]) < attempts {
                outcome.retries += 1
                stage[index] = .waiting
                retryQueue.append(index)
            } else {
                stage[index] = .failed
                outcome.failed += 1
                if outcome.firstFailure == nil { outcome.firstFailure = "subscriber \(index): \(reason)" }
            }
        }

        func begin(_ index: Int) {
            tries[index] += 1
            inFlight += 1
            stage[index] = .connecting
            startedAt[index] = clock.now().nanoseconds
            let fd: Int32
            do {
                fd = try Sockets.openTCP(nonBlocking: true, source: sources[index % sources.count])
            } catch {
                return fail(index, error.message)
            }
            table.descriptors[index] = fd
            // Every read then also tells when the kernel received the bytes (the arrival).
            _ = voipload_enable_receive_timestamps(fd)
            let error = Sockets.connect(fd, to: server)
            guard error == 0 else { return fail(index, ProbeError(call: "connect", code: error).message) }
            guard table.epoll.add(fd, token: UInt64(index), events: Epoll.output | Epoll.input) == 0 else {
                return fail(index, ProbeError(call: "epoll_ctl").message)
            }
        }

        func ready(_ index: Int, _ events: UInt32) {
            switch stage[index] {
            case .connecting:
                let error = SocketCalls.pendingError(table.descriptors[index])
                guard error == 0 else { return fail(index, ProbeError(call: "connect", code: error).message) }
                guard events & Epoll.output != 0 else { return }
                let fd = table.descriptors[index]
                guard Sockets.sendAll(fd, table.dialect.subscriberGreeting(index)),
                      table.epoll.modify(fd, token: UInt64(index), events: Epoll.input) == 0 else {
                    return fail(index, ProbeError(call: "send").message)
                }
                stage[index] = .greeted
            case .greeted:
                switch table.read(index, into: &inbound) {
                case .nothing: break
                case .failed(let reason): fail(index, reason)
                case .received:
                    if inbound.established {
                        stage[index] = .established
                        inFlight -= 1
                        outcome.established += 1
                    }
                }
            case .established:
                // The server spoke or hung up before any event was sent: the subscriber is lost.
                if case .failed(let reason) = table.read(index, into: &inbound) {
                    table.drop(index)
                    stage[index] = .failed
                    outcome.established -= 1
                    outcome.failed += 1
                    if outcome.firstFailure == nil { outcome.firstFailure = "subscriber \(index) after its handshake: \(reason)" }
                }
            case .waiting, .failed:
                break
            }
        }

        while outcome.established + outcome.failed < count {
            while inFlight < maxInFlight {
                if let index = retryQueue.popLast() {
                    begin(index)
                } else if next < count {
                    next += 1
                    begin(next - 1)
                } else {
                    break
                }
            }
            table.epoll.wait(timeoutMilliseconds: 10) { token, events in ready(Int(token), events) }
            let now = clock.now().nanoseconds
            if now - lastTimeoutScan > 100_000_000 {
                lastTimeoutScan = now
                for index in 0..<count where stage[index] == .connecting || stage[index] == .greeted {
                    if now - startedAt[index] > handshakeTimeoutNanoseconds {
                        fail(index, "no handshake within \(handshakeTimeoutNanoseconds / 1_000_000_000) s")
                    }
                }
            }
        }
        outcome.seconds = Double(clock.now().nanoseconds - start) / 1e9
        return outcome
    }
}
