import Foundation
import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The executable as a systemd service runs it (deploy/voipserver.service): sd_notify on a
/// real NOTIFY_SOCKET, JSON logs, the admin API's options.
@Suite("voipserver as a service: sd_notify, JSON logs, admin options")
struct ServiceDeploymentTests {
    /// A unix datagram socket standing in for systemd's notification socket.
    final class NotifySocket {
        let path: String
        let fd: Int32

        init(in directory: TemporaryDirectory) throws {
            path = directory.file("notify.sock")
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { throw HTTPRequestFailure(description: "socket: \(errno)") }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { buffer in
                for (index, byte) in path.utf8.enumerated() where index < buffer.count - 1 { buffer[index] = byte }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard bound == 0 else { throw HTTPRequestFailure(description: "bind \(path): \(errno)") }
        }

        deinit { close(fd) }

        /// The next datagram's text, within `timeout`.
        func next(timeout: Duration = .seconds(20)) throws -> String {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, Int32(timeout.milliseconds)) > 0 else {
                throw HTTPRequestFailure(description: "no notification within \(timeout)")
            }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { throw HTTPRequestFailure(description: "recv: \(errno)") }
            return String(decoding: buffer[..<count], as: UTF8.self)
        }
    }

    @Test("with NOTIFY_SOCKET set, the server sends READY=1 once listening, RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on SIGTERM")
    func systemdNotify() throws {
        let directory = try TemporaryDirectory("sd-notify")
        let notify = try NotifySocket(in: directory)
        let log = directory.file("server.log")
        let process = try ChildProcess.spawn(
            "/usr/bin/env", arguments: [
                "NOTIFY_SOCKET=\(notify.path)", ExecutableRun.path(of: "voipserver"), "--listen", "127.0.0.1:0",
                "--store", "memory",
            ], pipeInput: false, stdout: .file(log), stderr: .file(log))
        defer {
            process.send(signal: SIGKILL)
            _ = process.waitForExit(timeoutSeconds: 10)
        }
        let ready = try notify.next()
        #expect(ready.split(separator: "\n").contains("READY=1"), "\(ready)")
        #expect(ready.contains("MAINPID="))
        // READY comes after the listeners are up: the log already says so.
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("event=listening"), "\(text)")

        process.send(signal: SIGHUP)
        let reloading = try notify.next()
        #expect(reloading.split(separator: "\n").contains("RELOADING=1"), "\(reloading)")
        #expect(reloading.contains("MONOTONIC_USEC="))
        #expect(try notify.next().split(separator: "\n").contains("READY=1"))

        process.send(signal: SIGTERM)
        #expect(try notify.next().split(separator: "\n").contains("STOPPING=1"))
        let status = process.waitForExit(timeoutSeconds: 30)
        #expect(status.map { ($0 >> 8) & 0xff } == 0)
    }

    @Test("--log-format json writes one JSON object per line, with the same events and fields")
    func jsonLogs() throws {
        let server = try ServerProcess(["--store", "memory", "--log-format", "json", "--admin-listen", "127.0.0.1:0"])
        let adminPort = try #require(Self.adminPort(in: server.log))
        // A reload logs a few more lines, with fields.
        server.process.send(signal: SIGHUP)
        let deadline = SystemClock().now() + .seconds(20)
        while !server.log.contains("\"event\":\"reloaded\"") && SystemClock().now() < deadline { usleep(5_000) }
        #expect(server.log.contains("\"event\":\"reloaded\""))
        #expect(try HTTPRequest.send("GET", port: adminPort, "/healthz").status == 200)
        #expect(server.terminate() == 0)

        let lines = server.log.split(separator: "\n")
        #expect(lines.count >= 5)
        for line in lines {
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            #expect(object != nil, "not a JSON object: \(line)")
            #expect(object?["ts"] is String && object?["level"] is String && object?["event"] is String, "\(line)")
        }
        let listening = lines.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            .first { $0["event"] as? String == "listening" }
        #expect(listening?["version"] as? String == ProductVersion.current)
        #expect(listening?["workers"] is Int, "numbers stay numbers")
        #expect(lines.contains { $0.contains("\"event\":\"admin_unauthenticated\"") })
    }

    @Test("the admin API refuses a non-loopback address without a token, and needs --admin-listen for a token file")
    func adminOptions() throws {
        let open = try ExecutableRun.run("voipserver", ["--admin-listen", "0.0.0.0:9464", "--store", "memory"], timeoutSeconds: 30)
        #expect(open.exitCode == 64)
        #expect(open.stderr.contains("loopback"), "\(open.stderr)")
        let directory = try TemporaryDirectory("admin-token")
        try "t0ken\n".write(toFile: directory.file("token"), atomically: true, encoding: .utf8)
        let orphan = try ExecutableRun.run("voipserver", ["--admin-token-file", directory.file("token")], timeoutSeconds: 30)
        #expect(orphan.exitCode == 64)
        #expect(orphan.stderr.contains("--admin-listen"), "\(orphan.stderr)")
        let bad = try ExecutableRun.run("voipserver", ["--log-format", "xml"], timeoutSeconds: 30)
        #expect(bad.exitCode == 64)

        // With a token file, the API answers only with the token; a bare port means loopback.
        let server = try ServerProcess(["--store", "memory", "--admin-listen", "0", "--admin-token-file", directory.file("token")])
        let port = try #require(Self.adminPort(in: server.log))
        #expect(try HTTPRequest.send("GET", port: port, "/metrics").status == 401)
        #expect(try HTTPRequest.send("GET", port: port, "/metrics", headers: ["Authorization": "Bearer t0ken"]).status == 200)
    }

    @Test("the curl examples of docs/ADMIN-API.md work against a real server")
    func curlExamples() throws {
        let server = try ServerProcess(["--admin-listen", "127.0.0.1:0"])
        let port = try #require(Self.adminPort(in: server.log))
        let directory = try TemporaryDirectory("curl")
        func curl(_ arguments: [String]) throws -> (status: Int32, output: String) {
            let out = directory.file("out-\(UInt32.random(in: 0...UInt32.max))")
            let process = try ChildProcess.spawn(
                "/usr/bin/curl", arguments: ["-sS", "-o", out, "-w", "%{http_code}"] + arguments, pipeInput: false,
                stdout: .file(out + ".code"), stderr: .discard)
            let status = process.waitForExit(timeoutSeconds: 30) ?? -1
            let code = (try? String(contentsOfFile: out + ".code", encoding: .utf8)) ?? ""
            return (status == 0 ? Int32(code) ?? -1 : -1, (try? String(contentsOfFile: out, encoding: .utf8)) ?? "")
        }
        let base = "http://127.0.0.1:\(port)"
        #expect(try curl(["\(base)/healthz"]).status == 200)
        #expect(try curl(["\(base)/readyz"]).status == 200)
        let metrics = try curl(["\(base)/metrics"])
        #expect(metrics.status == 200 && metrics.output.contains("voipserver_build_info"))
        // No device of bob yet: 404 with a JSON error.
        let unknown = try curl(["-X", "POST", "\(base)/v1/messages", "-H", "Content-Type: application/json",
                                "-d", #"{"to":"bob","messageId":"welcome-1","body":"Welcome to the app!"}"#])
        #expect(unknown.status == 404 && unknown.output.contains("unknownUser"), "\(unknown)")
        #expect(try curl(["\(base)/v1/users/bob/devices"]).status == 404)
        #expect(try curl(["-X", "DELETE", "\(base)/v1/users/bob/devices/phone"]).status == 404)
        #expect(try curl(["-X", "DELETE", "\(base)/v1/users/bob"]).status == 404)
    }

    /// The admin port from the `admin_listening` line (key=value or JSON).
    static func adminPort(in log: String) -> UInt16? {
        for line in log.split(separator: "\n") where line.contains("admin_listening") {
            guard let start = line.range(of: "127.0.0.1:") else { continue }
            return UInt16(String(line[start.upperBound...].prefix { $0.isNumber }))
        }
        return nil
    }
}
