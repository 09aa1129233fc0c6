import Foundation
import SignalingServer
import SignalingSupport
import TestSupport
import Testing

/// The configuration file's syntax (docs/CONFIGURATION.md, "The file"): comments, quotes,
/// repeated names, and where an error is.
@Suite("Configuration file")
struct ConfigurationFileTests {
    /// Writes `text` to a fresh file and parses `--config FILE` plus `extra`.
    private func parse(_ text: String, _ extra: [String] = []) throws(UsageError) -> (ServerConfiguration, path: String) {
        let path = "/tmp/voipserver-config-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, text))
        defer { removeFile(path) }
        return (try ServerOptions.configuration(from: ["--config", path] + extra).0, path)
    }

    /// The message of the error parsing `text` gives, with the file's path written `FILE`.
    private func failure(_ text: String, _ extra: [String] = []) -> String? {
        let path = "/tmp/voipserver-config-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, text))
        defer { removeFile(path) }
        do {
            _ = try ServerOptions.configuration(from: ["--config", path] + extra)
            return nil
        } catch {
            return error.message.replacingOccurrences(of: path, with: "FILE")
        }
    }

    @Test("a # inside a value is part of it; a comment starts a line or follows whitespace")
    func hashInValue() throws {
        let (configuration, _) = try parse("""
            # a comment line
              # an indented one
            auth-secret = abc#def
            data-dir = /srv/data#1   # a comment after whitespace
            ring-timeout = 30\t# after a tab
            """)
        #expect(configuration.authSecret == "abc#def")
        #expect(configuration.storage.directory == "/srv/data#1")
        #expect(configuration.ringTimeout == .seconds(30))
    }

    @Test("quoted values lose their quotes; double quotes know \\\" and \\\\, single quotes nothing")
    func quotedValues() throws {
        let (configuration, _) = try parse(#"""
            auth-secret = "a b # not a comment \"q\" \\ end"   # a comment
            data-dir = '/srv/my data/\n#'
            log-level = "debug"
            """#)
        #expect(configuration.authSecret == #"a b # not a comment "q" \ end"#)
        #expect(configuration.storage.directory == #"/srv/my data/\n#"#)
        #expect(configuration.logLevel == .debug)
    }

    @Test("a name given twice is an error naming the file and both lines")
    func repeatedName() {
        #expect(failure("keepalive = 900\nworkers = 1\nkeepalive = 1200\n") == "FILE:3: 'keepalive' is already set on line 1")
    }

    @Test("quoting mistakes name the file and line", arguments: [
        ("auth-secret = \"abc\n", "FILE:1: auth-secret: the value has no closing \""),
        ("workers = 1\nauth-secret = 'abc\n", "FILE:2: auth-secret: the value has no closing '"),
        ("auth-secret = \"a\\nb\"\n", "FILE:1: auth-secret: unknown escape '\\n' in a quoted value (only \\\" and \\\\ exist)"),
        ("auth-secret = \"abc\"def\n", "FILE:1: auth-secret: unexpected text after the closing \""),
    ])
    func quotingMistakes(text: String, expected: String) {
        #expect(failure(text) == expected)
    }

    @Test("a bad value in the file names the file and line; the same value on the command line does not")
    func valueErrorsCarryTheLine() {
        #expect(failure("workers = 1\nring-timeout = 0\n") == "FILE:2: --ring-timeout must be between 1.0 and 3600.0, got 0")
        #expect(failure("workers = 1\nmax-frame = 4096\nmax-queued-bytes = 1024\n")?.hasPrefix("FILE:3: ") == true)
        #expect(failure("auth-secret-file = /nonexistent/secret\n") == "FILE:1: --auth-secret-file: cannot read a secret from /nonexistent/secret")
        #expect(failure("ring-timeout = 30\n", ["--ring-timeout", "0"]) == "--ring-timeout must be between 1.0 and 3600.0, got 0")
    }
}

@Suite("Listen backlog")
struct ListenBacklogTests {
    @Test("the default is the kernel's net.core.somaxconn, or 4096 where it cannot be read")
    func defaultIsSystemMaximum() throws {
        let scratch = try TemporaryDirectory("somaxconn")
        let path = scratch.file("somaxconn")
        #expect(writeFile(path, "65535\n"))
        #expect(ServerConfiguration.systemMaxListenBacklog(path: path) == 65535)
        #expect(ServerConfiguration.systemMaxListenBacklog(path: scratch.file("missing")) == 4096)
        let system = Int(readTextFile("/proc/sys/net/core/somaxconn")?.split(separator: "\n").first ?? "") ?? 4096
        #expect(ServerConfiguration().listenBacklog == system)
        #expect(try ServerOptions.configuration(from: []).0.listenBacklog == system)
        #expect(try ServerOptions.configuration(from: ["--listen-backlog", "128"]).0.listenBacklog == 128)
    }

    @Test("--listen-backlog reaches listen(2): ss shows it as the listening socket's queue limit")
    func backlogReachesTheSocket() throws {
        let server = try ServerProcess(["--listen-backlog", "77", "--workers", "2", "--store", "memory"])
        #expect(server.log.contains("backlog=77"), "\(server.log)")
        let scratch = try TemporaryDirectory("ss")
        let ss = try ChildProcess.spawn(
            "/usr/bin/ss", arguments: ["-ltnH", "sport = :\(server.port)"], pipeInput: false,
            stdout: .file(scratch.file("out")), stderr: .discard)
        #expect(ss.waitForExit(timeoutSeconds: 10) == 0)
        // LISTEN  Recv-Q  Send-Q(= the backlog)  local  peer: one line per loop's socket.
        let output = readTextFile(scratch.file("out")) ?? ""
        let limits = output.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true)[2] }
        #expect(limits == ["77", "77"], "\(output)")
    }
}
