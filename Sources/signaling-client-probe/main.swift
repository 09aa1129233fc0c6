// signaling-client-probe: runs one SignalingClient and prints what happens to it, one
// line per event, so tests can drive the library from another process, e.g. inside a
// network namespace (`ip netns exec NS signaling-client-probe ...`). It stops when its
// standard input closes.
import Foundation
import SignalingClient
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

let parser = CommandLineParser(
    command: "signaling-client-probe",
    usage: "signaling-client-probe --host HOST --port PORT --user ID --device ID [--connect-timeout SECONDS]",
    summary: "Connects a SignalingClient and prints its events, one per line, until stdin closes.",
    options: [
        OptionSpec("host", value: "HOST", help: "Server address."),
        OptionSpec("port", value: "PORT", help: "Server port."),
        OptionSpec("user", value: "ID", default: "probe", help: "User id."),
        OptionSpec("device", value: "ID", default: "probe-device", help: "Device id."),
        OptionSpec("connect-timeout", value: "SECONDS", default: "10", help: "Deadline of the first connect."),
        OptionSpec("log-level", value: "LEVEL", help: "Library log level on stderr (debug, info, warn, error)."),
    ],
    epilogue: "Lines: 'state connected local=A remote=B session=S resumed=BOOL', 'state waiting ...', 'network ...', 'woken REASON', 'message ID', 'connect ok|error ...'.")

/// One line on stdout in a single write, so lines never interleave.
func emit(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

func describe(_ event: ClientEvent) -> String? {
    switch event {
    case .connectionStateChanged(let state):
        switch state {
        case .connected(let info):
            return "state connected local=\(info.localAddress) remote=\(info.remoteAddress) session=\(info.sessionID) resumed=\(info.resumed)"
        case .connecting(let attempt): return "state connecting attempt=\(attempt)"
        case .waitingToReconnect(let delay, let reason): return "state waiting delay=\(delay) reason=\(reason)"
        case .disconnected: return "state disconnected"
        case .stopped(let reason): return "state stopped reason=\(reason)"
        }
    case .networkPathChanged(let change): return "network \(change)"
    case .woken(let reason): return "woken \(reason)"
    case .messageReceived(let message): return "message \(message.messageID) from=\(message.sender)"
    case .incomingCall(let call): return "call \(call.callID) from=\(call.caller)"
    default: return nil
    }
}

do {
    let options = try parser.parse(Array(CommandLine.arguments.dropFirst()))
    if options.helpRequested {
        print(parser.helpText, terminator: "")
        exit(0)
    }
    if options.versionRequested {
        print(ProductVersion.line(for: "signaling-client-probe"), terminator: "")
        exit(0)
    }
    guard let host = options.string("host") else { throw UsageError("--host is required") }
    guard let port = try options.int("port", in: 1...65535) else { throw UsageError("--port is required") }
    let timeout = try options.double("connect-timeout", in: 0.001...3600) ?? 10
    var logger = Logger.silent
    if let name = options.string("log-level") {
        guard let level = LogLevel(name: name) else { throw UsageError("--log-level must be debug, info, warn or error") }
        logger = Logger(level: level)
    }
    let configuration = ClientConfiguration(
        host: host, port: UInt16(port), userID: options.string("user") ?? "probe",
        deviceID: options.string("device") ?? "probe-device")
    let events = DispatchQueue(label: "probe.events")
    let client = try SignalingClient(configuration: configuration, logger: logger, eventQueue: events) { event in
        if let line = describe(event) { emit(line) }
    }
    do {
        let info = try client.connect(timeout: .milliseconds(Int64(timeout * 1000)))
        emit("connect ok session=\(info.sessionID)")
    } catch {
        emit("connect error \(error)")
    }
    // Run until stdin closes (the test's way to stop us without signals).
    var byte: UInt8 = 0
    while read(0, &byte, 1) > 0 {}
    client.shutdown()
    events.sync {}
    exit(0)
} catch let error as UsageError {
    FileHandle.standardError.write(Data("signaling-client-probe: \(error)\n\(parser.usage)\n".utf8))
    exit(64)
} catch {
    FileHandle.standardError.write(Data("signaling-client-probe: \(error)\n".utf8))
    exit(70)
}
