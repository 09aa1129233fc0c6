import Foundation
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The interactive mode in a real pseudo-terminal (tmux), against a real server.
@Suite("voipclient interactive mode", .enabled(if: Tmux.isAvailable, "tmux is not installed (Tools/ensure-deps installs it)"))
struct InteractiveModeTests {
    private static func shellQuoted(_ words: [String]) -> String {
        words.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
    }

    @Test("an incoming call rings on screen without garbling the line being typed; answer, probe, status, quit")
    func incomingCall() throws {
        let server = try ServerProcess(["--store", "memory", "--workers", "1"])
        let server127 = "127.0.0.1:\(server.port)"
        let tmux = try Tmux(command: Self.shellQuoted([ExecutableRun.path(of: "voipclient"), "--server", server127,
                                                       "--user", "bob", "--device", "desk",
                                                       "--probe-packets", "10", "--probe-interval", "5"]))
        let prompt = "bob@desk [connected]> "
        var screen = try tmux.waitForScreen { $0.contains(prompt) }
        #expect(screen.matched, "no connected prompt:\n\(screen.screen)")

        // Half a command typed when the call arrives: it must still be there afterwards.
        try tmux.send("hel")
        #expect(try tmux.waitForScreen { $0.contains(prompt + "hel") }.matched)
        let alice = try VoipClientProcess(["--server", server127, "--user", "alice", "call", "bob", "--hangup-after", "0.2",
                                           "--timeout", "20", "--probe-packets", "10", "--probe-interval", "5"])
        screen = try tmux.waitForScreen { $0.contains("incoming call from alice") && $0.contains("(ringing: alice)> hel") }
        #expect(screen.matched, "the call did not show, or the typed text was lost:\n\(screen.screen)")
        let lines = screen.screen.split(separator: "\n")
        #expect(lines.filter { $0.contains("(ringing: alice)>") }.count == 1, "one prompt line only:\n\(screen.screen)")
        #expect(!screen.screen.contains(prompt + "hel"), "the old prompt row was not redrawn in place:\n\(screen.screen)")

        try tmux.send("C-u", "answer", "Enter")
        #expect(alice.exitCode() == 0, "\(alice.stderr)\n\(alice.stdout)")
        screen = try tmux.waitForScreen { $0.contains("media probe to") && $0.contains("alice hung up") }
        #expect(screen.matched, "\(screen.screen)")
        #expect(screen.screen.contains("answered alice"))

        try tmux.send("status", "Enter")
        screen = try tmux.waitForScreen { $0.contains("keep-alive:  600 s") && $0.contains("reconnects:  0") }
        #expect(screen.matched, "\(screen.screen)")

        try tmux.send("calls", "Enter")
        screen = try tmux.waitForScreen { $0.contains("from alice: ended (alice hung up)") && $0.contains("probe 10/10") }
        #expect(screen.matched, "\(screen.screen)")

        try tmux.send("quit", "Enter")
        let deadline = SystemClock().now() + .seconds(10)
        while tmux.isRunning && SystemClock().now() < deadline { usleep(20_000) }
        #expect(!tmux.isRunning, "voipclient did not exit on quit")
    }

    @Test("commands and mistakes at the prompt; a message arrives while typing; history recalls the last command")
    func messagesAndHistory() throws {
        let server = try ServerProcess(["--store", "memory", "--workers", "1"])
        let server127 = "127.0.0.1:\(server.port)"
        let tmux = try Tmux(command: Self.shellQuoted([ExecutableRun.path(of: "voipclient"), "--server", server127, "--user", "carol"]))
        #expect(try tmux.waitForScreen { $0.contains("carol@voipclient [connected]> ") }.matched)

        try tmux.send("dance", "Enter")
        #expect(try tmux.waitForScreen { $0.contains("unknown command 'dance' (type 'help')") }.matched)
        try tmux.send("answer", "Enter")
        #expect(try tmux.waitForScreen { $0.contains("no ringing incoming call") }.matched)

        try tmux.send("msg dave")
        let sent = try ExecutableRun.run("voipclient", ["--server", server127, "--user", "dave", "send", "carol", "ping from dave"],
                                         timeoutSeconds: 30)
        #expect(sent.exitCode == 0, "\(sent.stderr)")
        var screen = try tmux.waitForScreen { $0.contains("message from dave: ping from dave") && $0.contains("> msg dave") }
        #expect(screen.matched, "\(screen.screen)")
        try tmux.send(" hi back", "Enter")
        #expect(try tmux.waitForScreen { $0.contains("to dave accepted by the server") }.matched)

        try tmux.send("history", "Enter")
        screen = try tmux.waitForScreen { $0.contains("from dave: ping from dave") && $0.contains("to dave: hi back (accepted)") }
        #expect(screen.matched, "\(screen.screen)")

        // Up twice: the 'msg' line; edit its end and send it again.
        try tmux.send("Up", "Up", "BSpace", "BSpace", "!!", "Enter")
        screen = try tmux.waitForScreen { $0.contains("> msg dave hi ba!!") }
        #expect(screen.matched, "\(screen.screen)")

        try tmux.send("C-d")
        let deadline = SystemClock().now() + .seconds(10)
        while tmux.isRunning && SystemClock().now() < deadline { usleep(20_000) }
        #expect(!tmux.isRunning, "voipclient did not exit on Ctrl-D")
    }
}
