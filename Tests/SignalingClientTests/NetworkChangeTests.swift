import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
import TestSupport
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

@Suite("Network changes")
struct NetworkChangeTests {
    @Test("the path evaluator: loopback is configured and preferred; an address nobody has is gone")
    func pathEvaluator() throws {
        let loopback = SocketAddress(family: AF_INET, addressBytes: [127, 0, 0, 1], port: 5000)!
        #expect(PathEvaluator.isConfigured(loopback))
        #expect(PathEvaluator.evaluate(local: loopback, remote: loopback.withPort(7443)) == nil)
        // 192.0.2.0/24 is TEST-NET-1: never configured here. Nothing is sent anywhere.
        let gone = SocketAddress(family: AF_INET, addressBytes: [192, 0, 2, 77], port: 5000)!
        #expect(PathEvaluator.evaluate(local: gone, remote: loopback) == .localAddressRemoved(gone))
    }

    @Test("the netlink monitor reports addresses added and removed in its namespace",
          .enabled(if: NetworkNamespaces.isSupported, "needs root and iproute2"))
    func netlinkMonitorSeesAddressChanges() throws {
        let namespaces = NetworkNamespaces()
        let ns = try namespaces.create("nl")
        let changes = LockedBox<[NetworkChange]>([])
        let seen = NSCondition()
        let monitor = NetlinkMonitor()
        defer { monitor.stop() }
        // The netlink socket is opened by a thread inside the namespace.
        try NetworkNamespaces.run(inNamespace: ns) {
            try monitor.start { change in
                seen.lock(); changes.mutate { $0.append(change) }; seen.broadcast(); seen.unlock()
            }
        }
        func waitFor(_ predicate: ([NetworkChange]) -> Bool) -> Bool {
            let deadline = Date(timeIntervalSinceNow: 10)
            seen.lock()
            defer { seen.unlock() }
            while !predicate(changes.value) { if !seen.wait(until: deadline) { return predicate(changes.value) } }
            return true
        }
        // A veth pair inside the namespace (the dummy driver is not always available).
        try NetworkNamespaces.ip(["-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"])
        try NetworkNamespaces.ip(["-n", ns, "link", "set", "va", "up"])
        try NetworkNamespaces.ip(["-n", ns, "link", "set", "vb", "up"])
        try NetworkNamespaces.ip(["-n", ns, "addr", "add", "10.99.0.1/24", "dev", "va"])
        let address = SocketAddress(family: AF_INET, addressBytes: [10, 99, 0, 1], port: 0)!
        #expect(waitFor { $0.contains { $0.addressesAdded.contains(address) } })
        #expect(waitFor { $0.contains { $0.linksChanged > 0 } })
        try NetworkNamespaces.ip(["-n", ns, "addr", "del", "10.99.0.1/24", "dev", "va"])
        #expect(waitFor { $0.contains { $0.addressesRemoved.contains(address) } })
        #expect(waitFor { $0.contains { $0.routesChanged > 0 } })
    }

    @Test("for real: the client in a namespace loses its address, notices through netlink and reconnects from the new one",
          .enabled(if: NetworkNamespaces.isSupported, "needs root and iproute2"))
    func clientFollowsAddressChange() throws {
        let namespaces = NetworkNamespaces()
        let serverNS = try namespaces.create("srv")
        let clientNS = try namespaces.create("cli")
        func ip(_ arguments: [String]) throws { try NetworkNamespaces.ip(arguments) }
        // client (vc: 10.77.0.2) <-- veth --> server (vs: 10.77.0.1); default routes over
        // the pair so the client can still reach the server from another subnet later.
        try ip(["-n", clientNS, "link", "add", "vc", "type", "veth", "peer", "name", "vs", "netns", serverNS])
        try ip(["-n", serverNS, "addr", "add", "10.77.0.1/24", "dev", "vs"])
        try ip(["-n", clientNS, "addr", "add", "10.77.0.2/24", "dev", "vc"])
        for (ns, dev) in [(serverNS, "vs"), (clientNS, "vc")] {
            try ip(["-n", ns, "link", "set", "lo", "up"])
            try ip(["-n", ns, "link", "set", dev, "up"])
            try ip(["-n", ns, "route", "add", "default", "dev", dev])
        }

        let temporary = try TemporaryDirectory("vsig-netns")
        let serverLog = temporary.file("server.log")
        let server = try ChildProcess.spawn(
            NetworkNamespaces.ipPath!, arguments: ["netns", "exec", serverNS, ExecutableRun.path(of: "voipserver"),
                                                   "--listen", "10.77.0.1:7443", "--allow-anonymous", "--store", "memory", "--workers", "1"],
            pipeInput: false, stdout: .file(serverLog), stderr: .file(serverLog))
        defer { server.send(signal: SIGKILL); _ = server.waitForExit(timeoutSeconds: 10) }
        #expect(poll(until: Date(timeIntervalSinceNow: 20)) {
            ((try? String(contentsOfFile: serverLog, encoding: .utf8)) ?? "").contains("event=listening")
        }, "voipserver did not start: \((try? String(contentsOfFile: serverLog, encoding: .utf8)) ?? "")")

        let probe = try ChildProcess.spawn(
            NetworkNamespaces.ipPath!, arguments: ["netns", "exec", clientNS, ExecutableRun.path(of: "signaling-client-probe"),
                                                   "--host", "10.77.0.1", "--port", "7443", "--user", "roamer", "--device", "phone"],
            pipeInput: true, stdout: .pipe, stderr: .discard)
        defer {
            probe.closeInput()
            if probe.waitForExit(timeoutSeconds: 10) == nil { probe.send(signal: SIGKILL); _ = probe.waitForExit(timeoutSeconds: 5) }
        }
        let output = LineReader(descriptor: probe.output)
        let first = try output.waitForLine(containing: "state connected")
        #expect(first.contains("local=10.77.0.2:"))

        // A second address appears (nothing changes for the socket), then the one the
        // socket uses is removed: the client must notice and move to the new one.
        try ip(["-n", clientNS, "addr", "add", "10.78.0.2/24", "dev", "vc"])
        try ip(["-n", clientNS, "addr", "del", "10.77.0.2/24", "dev", "vc"])
        let change = try output.waitForLine(containing: "network ")
        #expect(change.contains("local address 10.77.0.2 removed"))
        let second = try output.waitForLine(containing: "local=10.78.0.2:", within: Duration.seconds(15))
        #expect(second.contains("state connected") && second.contains("resumed=true"))
        #expect(output.lines.filter { $0.contains("state connected") }.count == 2)
    }
}
