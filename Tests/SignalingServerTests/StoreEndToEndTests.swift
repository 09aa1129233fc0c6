import SignalingProtocol
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The real `voipserver` with its SQLite store in a temporary data directory: crashes,
/// restarts, offline devices and a full store.
@Suite("Store end to end (voipserver subprocess, SQLite)", .serialized)
struct StoreEndToEndTests {
    func message(_ id: String, to recipient: String, bytes: Int = 16) -> Request {
        .messageSend(OutgoingMessage(
            messageID: id, recipient: recipient, contentType: "text/plain",
            body: Array(id.utf8) + [UInt8](repeating: 0x2E, count: max(0, bytes - id.utf8.count))))
    }

    /// A device as an app would run it: keeps the highest sequence number it processed,
    /// drops anything at or below it, acknowledges what it processed.
    /// A device's app as the client library runs it: events at or below the last processed
    /// number are re-sends and dropped; a message id seen before is a copy the sender sent
    /// again after a crash (it never got its OK) and is dropped too (PROTOCOL §5).
    final class App {
        var processedSeq: UInt64 = 0
        var session: SessionID?
        var seen: [String: Int] = [:]
        /// Message ids that arrived a second time under a new number.
        var copies: Set<String> = []

        func process(_ client: TestClient, until done: () -> Bool, timeout: Duration = .seconds(30)) throws {
            let deadline = SystemClock().now() + timeout
            while !done() {
                let remaining = deadline - SystemClock().now()
                guard remaining > .zero else { throw TestClient.Failure("gave up waiting for messages") }
                try handle(client.nextEvent(timeout: remaining), on: client)
            }
        }

        /// Processes what has arrived, waiting at most `quiet` for each next event.
        func processAvailable(_ client: TestClient, quiet: Duration = .milliseconds(20)) throws {
            while let next = try? client.nextEvent(timeout: quiet) { try handle(next, on: client) }
        }

        private func handle(_ next: (seq: UInt64, event: Event), on client: TestClient) throws {
            guard next.seq > processedSeq else { return }  // already processed: a re-send
            if case .message(let message) = next.event {
                if seen[message.messageID] == nil { seen[message.messageID] = 1 } else { copies.insert(message.messageID) }
            }
            processedSeq = next.seq
            try client.ack(next.seq)
        }
    }

    @Test("kill -9 mid-stream: every message a sender saw accepted is delivered after the restart, none twice")
    func killNineMidStream() throws {
        let data = try TemporaryDirectory("voipserver-kill9")
        let total = 3000
        var accepted: Set<String> = []
        let bob = App()

        do {
            let server = try ServerProcess(["--data-dir", data.path, "--workers", "2"])
            let receiver = try TestClient(port: server.port)
            bob.session = try receiver.hello(user: "bob", device: "phone").sessionID
            let sender = try TestClient(port: server.port)
            try sender.hello(user: "alice", device: "laptop")

            // Pipeline sends (a window of 64 in flight) and kill the server mid-stream.
            var next = 0
            var inFlight: [UInt32: String] = [:]
            while next < total {
                while inFlight.count < 64 && next < total {
                    let id = "m\(next)"
                    try sender.send(.request(id: UInt32(next), message(id, to: "bob")))
                    inFlight[UInt32(next)] = id
                    next += 1
                }
                let reply = try sender.expect(timeout: .seconds(10), "a reply") { frame -> Frame? in
                    switch frame {
                    case .ok, .error: return frame
                    default: return nil
                    }
                }
                if case .ok(let requestID, _) = reply, let id = inFlight.removeValue(forKey: requestID) { accepted.insert(id) }
                // Bob processes some of what arrives meanwhile, like a real device (with
                // --delivery immediate, also messages whose commit, and OK, are still to come).
                if accepted.count % 200 == 0 { try bob.processAvailable(receiver) }
                if accepted.count >= total / 3 { break }
            }
            #expect(kill(server.process.pid, SIGKILL) == 0)
            _ = server.process.waitForExit(timeoutSeconds: 10)
        }
        #expect(accepted.count >= total / 3)

        // Restart on the same data directory. The sender re-sends everything it did not see
        // accepted (same message ids); bob resumes where its app left off.
        let server = try ServerProcess(["--data-dir", data.path, "--workers", "2"])
        let sender = try TestClient(port: server.port)
        try sender.hello(user: "alice", device: "laptop")
        for index in 0..<total where !accepted.contains("m\(index)") {
            let reply = try sender.request(UInt32(index), message("m\(index)", to: "bob"))
            #expect(reply.isOK, "m\(index): \(reply)")
        }
        let receiver = try TestClient(port: server.port)
        let welcome = try receiver.hello(
            user: "bob", device: "phone",
            resume: ResumePoint(sessionID: bob.session!, lastReceivedSeq: bob.processedSeq))
        #expect(welcome.resumed, "the session survived the crash")
        try bob.process(receiver, until: { bob.seen.count == total })
        #expect(bob.seen.count == total)
        for id in accepted { #expect(bob.seen[id] == 1, "accepted \(id) was lost") }
        // A message the sender saw accepted is never sent again, so it can never arrive
        // under a second number; only unaccepted ones may (and the app drops those).
        #expect(bob.copies.isDisjoint(with: accepted), "accepted messages delivered twice: \(bob.copies.intersection(accepted).sorted())")
        #expect(bob.processedSeq > 0)
    }

    @Test("an offline recipient gets its queued messages in order after a restart; the sender gets receipts")
    func offlineRecipientAcrossRestart() throws {
        let data = try TemporaryDirectory("voipserver-offline")
        do {
            let server = try ServerProcess(["--data-dir", data.path])
            do {
                let bob = try TestClient(port: server.port)
                try bob.hello(user: "bob", device: "phone")
            }
            let alice = try TestClient(port: server.port)
            try alice.hello(user: "alice", device: "laptop")
            for index in 1...5 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
            #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
        }
        let server = try ServerProcess(["--data-dir", data.path])
        let alice = try TestClient(port: server.port)
        try alice.hello(user: "alice", device: "laptop")
        let bob = try TestClient(port: server.port)
        try bob.hello(user: "bob", device: "phone")
        var order: [String] = []
        for _ in 1...5 {
            let (seq, event) = try bob.nextEvent()
            if case .message(let message) = event { order.append(message.messageID) }
            try bob.ack(seq)
        }
        #expect(order == ["m1", "m2", "m3", "m4", "m5"])
        var receipts: [String] = []
        for _ in 1...5 {
            if case .messageDelivered(let id, "bob", "phone", _) = try alice.nextEvent().event { receipts.append(id) }
        }
        #expect(receipts == ["m1", "m2", "m3", "m4", "m5"])
    }

    @Test("a full store: senders get storeUnavailable, the server keeps running, and recovers when space returns")
    func fullStore() throws {
        let data = try TemporaryDirectory("voipserver-full")
        let server = try ServerProcess([
            "--data-dir", data.path, "--store-max-bytes", "262144", "--store-timeout", "0.3",
        ])
        do {
            let bob = try TestClient(port: server.port)
            try bob.hello(user: "bob", device: "phone")
        }
        let alice = try TestClient(port: server.port)
        try alice.hello(user: "alice", device: "laptop")
        var sent = 0
        var refused = false
        while sent < 2000 && !refused {
            let reply = try alice.request(UInt32(sent), message("m\(sent)", to: "bob", bytes: 2048))
            if reply.errorCode == .storeUnavailable { refused = true } else {
                #expect(reply.isOK)
                sent += 1
            }
        }
        #expect(refused, "a 256 KiB store took \(sent) messages of 2 KiB")
        #expect(sent >= 20, "the store refused almost at once: \(sent) accepted")
        // Still serving.
        try alice.send(.ping)
        #expect(try alice.expect("PONG") { $0 == .pong ? true : nil })

        // Bob collects and acknowledges everything: the space is freed and sending works again.
        let bob = try TestClient(port: server.port)
        try bob.hello(user: "bob", device: "phone")
        var received = 0
        while received < sent {
            let (seq, event) = try bob.nextEvent(timeout: .seconds(10))
            if case .message = event { received += 1 }
            try bob.ack(seq)
        }
        let deadline = SystemClock().now() + .seconds(20)
        var recovered = false
        var attempt: UInt32 = 10_000
        while !recovered && SystemClock().now() < deadline {
            let reply = try alice.request(attempt, message("after", to: "bob", bytes: 2048))
            recovered = reply.isOK
            attempt += 1
        }
        #expect(recovered)
        guard case .message(let late) = try bob.nextEvent(timeout: .seconds(10)).event else { Issue.record("not delivered"); return }
        #expect(late.messageID == "after")
    }
}
