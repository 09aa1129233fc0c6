import Foundation
import SignalingClient
import SignalingCrypto
import SignalingProtocol
import SignalingSupport
import SignalingTLS

/// The command line of `voipclient`: one parser for every mode (options may come before or
/// after the mode word), then a check that each option belongs to the chosen mode.
public enum VoipClientOptions {
    /// Options every mode accepts.
    static let commonNames: Set<String> = Set<String>([
        "server", "user", "device", "token", "token-file", "auth-secret", "auth-key-file", "connect-timeout", "log-level",
        "media-address", "media-port", "probe-packets", "probe-interval",
    ]).union(TLSClientConfiguration.commandLineNames)
    /// Options of some modes only (`json` and `timeout` belong to the three scripted modes).
    static let modeNames: [String: Set<String>] = [
        "interactive": [],
        "call": ["json", "require-media", "max-loss", "hangup-after", "timeout"],
        "listen": ["json", "require-media", "max-loss", "auto-answer", "auto-reject", "answer-after", "count", "count-calls", "timeout"],
        "send": ["json", "content-type", "message-id", "wait-delivered", "timeout"],
        "push-register": ["json", "kind", "token-text", "environment", "topic", "timeout"],
    ]

    public static let parser = CommandLineParser(
        command: "voipclient",
        usage: """
            voipclient --server HOST:PORT --user NAME [--device ID] [options]            (interactive)
                   voipclient --server HOST:PORT --user NAME listen [--auto-answer | --auto-reject] [--count N | --count-calls N]
                   voipclient --server HOST:PORT --user NAME call CALLEE [--hangup-after SECONDS] [--timeout SECONDS]
                   voipclient --server HOST:PORT --user NAME send RECIPIENT TEXT|- [--wait-delivered]
                   voipclient --server HOST:PORT --user NAME push-register --kind KIND --token HEX [--environment sandbox] [--topic ID]
            """,
        summary: """
            Places test calls and sends messages through a voipserver, by hand (an interactive prompt) or from \
            scripts (listen, call, send: the exit status says what happened). After an answer both ends \
            exchange a burst of UDP probe packets directly, to check that media could flow.
            """,
        options: [
            OptionSpec("server", value: "HOST:PORT[,...]", help: "The server (port 7443 when omitted; IPv6 as [ADDR]:PORT), or several separated by commas: the client moves on to the next when one fails. Required."),
            OptionSpec("user", value: "NAME", help: "Your user id. Required."),
            OptionSpec("device", value: "ID", default: "voipclient", help: "Your device id (two copies of one device evict each other)."),
            OptionSpec("token", value: "TOKEN", help: "Credentials: a device token (voipserver token), or a legacy --auth-secret token. push-register: the push token, in hex ('' unregisters the kind); credentials then come from --token-file, --auth-key-file or --auth-secret."),
            OptionSpec("token-file", value: "FILE", help: "Read the credentials from FILE (first line); read again when the server says the token expired."),
            OptionSpec("auth-key-file", value: "FILE", help: "Mint device tokens with the last key of the server's key file (test deployments)."),
            OptionSpec("auth-secret", value: "SECRET", help: "Compute legacy credentials from the server's --auth-secret (test deployments)."),
        ] + TLSClientConfiguration.commandLineOptions + [
            OptionSpec("json", help: "Print one JSON object per event (scripted modes; schema in docs/VOIPCLIENT.md)."),
            OptionSpec("connect-timeout", value: "SECONDS", default: "10", help: "Give up connecting after this long (exit 69)."),
            OptionSpec("log-level", value: "LEVEL", help: "Client library log on stderr: debug, info, warn or error."),
            OptionSpec("media-address", value: "ADDR", default: "the signaling socket's local address", help: "Numeric address for the UDP probe, bound and announced in the offer/answer."),
            OptionSpec("media-port", value: "PORT", default: "any free port", help: "UDP port of the probe."),
            OptionSpec("probe-packets", value: "N", default: "50", help: "Probe packets sent after the answer; 0 = no probe."),
            OptionSpec("probe-interval", value: "MS", default: "20", help: "Milliseconds between probe packets."),
            OptionSpec("require-media", help: "Exit 6 when no probe packet came back."),
            OptionSpec("max-loss", value: "PERCENT", help: "Exit 6 when the probe lost more than this (implies --require-media)."),
            OptionSpec("hangup-after", value: "SECONDS", default: "0", help: "call: hang up this long after the answer (the probe completes first)."),
            OptionSpec("timeout", value: "SECONDS", help: "call: give up after this long (default 90); listen: exit 4 if --count or --count-calls is not reached; send, push-register: (default 30)."),
            OptionSpec("auto-answer", help: "listen: answer every call (ringing first), probe, wait for the hang-up."),
            OptionSpec("auto-reject", help: "listen: decline every call."),
            OptionSpec("answer-after", value: "SECONDS", default: "0", help: "listen --auto-answer: ring this long before answering."),
            OptionSpec("count", value: "N", help: "listen: exit 0 after N calls or messages (default: until interrupted)."),
            OptionSpec("count-calls", value: "N", help: "listen: exit 0 after N calls; messages (pending ones too) are shown but not counted."),
            OptionSpec("content-type", value: "TYPE", default: "text/plain", help: "send: the message's content type."),
            OptionSpec("message-id", value: "ID", default: "a new UUID", help: "send: the message id (a repeated id is delivered once)."),
            OptionSpec("wait-delivered", help: "send: wait for the delivery receipt, not only the server's acceptance."),
            OptionSpec("kind", value: "KIND", help: "push-register: apns-voip, apns, fcm, or another name for the server's webhook gateway."),
            OptionSpec("token-text", value: "TEXT", help: "push-register: the push token as text (FCM tokens), instead of --token HEX."),
            OptionSpec("environment", value: "ENV", default: "the server's: production", help: "push-register: production or sandbox (APNs kinds)."),
            OptionSpec("topic", value: "ID", default: "the server's", help: "push-register: the app's bundle id (APNs kinds)."),
        ],
        epilogue: """
            MODES:
              (none)                 Interactive prompt; type 'help' there. Line editing, history, live events.
              listen                 Report incoming calls and messages.
              call CALLEE            Call, wait for the outcome, report timings and the probe.
              send RECIPIENT TEXT    Send a message ('-' reads the text from stdin; '--' before text starting with '-').
              push-register          Register this device's push token of one kind (PUSH_REGISTER), wait for the OK.

            EXIT STATUS:
              0 ok                    the call or message did what was asked
              2 callee unreachable    no device of the callee is online
              3 rejected              declined or busy
              4 timed out             no answer (ring timeout or --timeout), or listen/send waited in vain
              5 refused               by the server (unauthorized, replaced, error reply), a protocol error,
                                      or TLS (certificate rejected, no --pin matched, handshake failed)
              6 media failed          --require-media / --max-loss and the probe failed
              7 call dropped          the call broke after it was set up (peer disconnected)
              8 unsent messages       interactive: quit with messages the server never accepted (they are dropped)
              64 usage, 69 server unreachable, 70 internal error, 130/143 interrupted (SIGINT / SIGTERM, SIGHUP)

            EXAMPLES:
              voipclient --server 127.0.0.1:7443 --user bob listen --auto-answer --count-calls 1 &
              voipclient --server 127.0.0.1:7443 --user alice call bob --hangup-after 2 --json
              voipclient --server 127.0.0.1:7443 --user alice send bob "hello" --wait-delivered
              voipclient --server 127.0.0.1:7443 --user bob --device phone push-register --kind apns-voip --token 9a0f... --environment sandbox
              voipclient --server signal.example.net:7443 --tls --ca-file ca.pem --user alice listen

            See docs/VOIPCLIENT.md.
            """)

    public static func parse(_ arguments: [String]) throws(UsageError) -> Invocation {
        let parsed = try parser.parse(arguments)
        if parsed.helpRequested { return .help }
        if parsed.versionRequested { return .version }
        let mode = parsed.positionals.first ?? "interactive"
        guard let allowed = modeNames[mode], mode != "interactive" || parsed.positionals.isEmpty else {
            throw UsageError("unknown mode '\(mode)' (expected listen, call, send or push-register)")
        }
        for name in parsed.values.keys where !commonNames.contains(name) && !allowed.contains(name) {
            throw UsageError("--\(name) does not apply to \(mode == "interactive" ? "the interactive mode" : "'\(mode)'")")
        }
        // push-register takes --token as the push token, as the issue that asked for it
        // spells the command; its credentials come from the other three options.
        let common = try commonOptions(parsed, tokenIsCredentials: mode != "push-register")
        let operands = Array(parsed.positionals.dropFirst())
        switch mode {
        case "call":
            guard operands.count == 1 else { throw UsageError("call expects one callee, e.g. 'call bob'") }
            var call = CallOptions(callee: try identifier(operands[0], what: "callee"))
            if let value = try seconds(parsed, "hangup-after", 0...86_400) { call.hangupAfter = value }
            if let value = try seconds(parsed, "timeout", 0.1...86_400) { call.timeout = value }
            guard call.callee != common.user else { throw UsageError("cannot call yourself (\(common.user))") }
            return .run(.call(common, call))
        case "listen":
            guard operands.isEmpty else { throw UsageError("listen takes no operand, got '\(operands[0])'") }
            var listen = ListenOptions()
            switch (parsed.flag("auto-answer"), parsed.flag("auto-reject")) {
            case (true, true): throw UsageError("give --auto-answer or --auto-reject, not both")
            case (true, false): listen.answering = .autoAnswer
            case (false, true): listen.answering = .autoReject
            case (false, false): break
            }
            if parsed.has("answer-after") && listen.answering != .autoAnswer {
                throw UsageError("--answer-after needs --auto-answer")
            }
            if let value = try seconds(parsed, "answer-after", 0...3600) { listen.answerAfter = value }
            if parsed.has("count") && parsed.has("count-calls") { throw UsageError("give --count or --count-calls, not both") }
            listen.count = try parsed.int("count", in: 1...1_000_000)
            if let calls = try parsed.int("count-calls", in: 1...1_000_000) {
                listen.count = calls
                listen.countCallsOnly = true
            }
            listen.timeout = try seconds(parsed, "timeout", 0.1...(86_400 * 365))
            return .run(.listen(common, listen))
        case "send":
            guard operands.count == 2 else { throw UsageError("send expects a recipient and a text, e.g. send bob \"hello\"") }
            let body: SendOptions.Body = operands[1] == "-" ? .standardInput : .text(operands[1])
            var send = SendOptions(recipient: try identifier(operands[0], what: "recipient"), body: body)
            if let type = parsed.string("content-type") {
                guard !type.isEmpty, type.utf8.count <= ProtocolLimits.maxShortTextBytes else {
                    throw UsageError("--content-type must be 1-\(ProtocolLimits.maxShortTextBytes) bytes")
                }
                send.contentType = type
            }
            if let id = parsed.string("message-id") { send.messageID = try identifier(id, what: "--message-id") }
            send.waitDelivered = parsed.flag("wait-delivered")
            if let value = try seconds(parsed, "timeout", 0.1...86_400) { send.timeout = value }
            return .run(.send(common, send))
        case "push-register":
            guard operands.isEmpty else { throw UsageError("push-register takes no operand, got '\(operands[0])'") }
            return .run(.pushRegister(common, try pushRegisterOptions(parsed)))
        default:
            return .run(.interactive(common))
        }
    }

    static func commonOptions(_ parsed: ParsedOptions, tokenIsCredentials: Bool = true) throws(UsageError) -> CommonOptions {
        guard let serverText = parsed.string("server") else { throw UsageError("--server HOST:PORT is required") }
        guard let userText = parsed.string("user") else { throw UsageError("--user NAME is required") }
        let user = try identifier(userText, what: "--user")
        var common = CommonOptions(
            servers: try ServerAddress.parseList(serverText), user: user,
            device: try identifier(parsed.string("device") ?? "voipclient", what: "--device"))
        (common.credentials, common.credentialsSource) = try credentials(
            parsed, user: user, device: common.device, tokenIsCredentials: tokenIsCredentials)
        common.tls = try TLSClientConfiguration.parse(parsed)
        common.json = parsed.flag("json")
        if let value = try seconds(parsed, "connect-timeout", 0.1...3600) { common.connectTimeout = value }
        if let name = parsed.string("log-level") {
            guard let level = LogLevel(name: name) else { throw UsageError("--log-level must be debug, info, warn or error") }
            common.logLevel = level
        }
        if let address = parsed.string("media-address") {
            guard UDPEndpoint(host: address, port: 0) != nil else {
                throw UsageError("--media-address must be a numeric IPv4 or IPv6 address, got '\(address)'")
            }
            common.media.address = address
        }
        if let port = try parsed.int("media-port", in: 0...65_535) { common.media.port = UInt16(port) }
        if let packets = try parsed.int("probe-packets", in: 0...10_000) { common.media.packets = packets }
        if let interval = try parsed.int("probe-interval", in: 1...1000) { common.media.interval = .milliseconds(interval) }
        if let loss = try parsed.double("max-loss", in: 0...100) {
            common.media.maximumLossPercent = loss
        } else if parsed.flag("require-media") {
            common.media.maximumLossPercent = ProbeVerdict.anythingButTotalLoss
        }
        if common.media.maximumLossPercent != nil && common.media.packets == 0 {
            throw UsageError("--require-media and --max-loss need probe packets (--probe-packets is 0)")
        }
        return common
    }

    static func credentials(_ parsed: ParsedOptions, user: String, device: String, tokenIsCredentials: Bool = true)
        throws(UsageError) -> ([UInt8]?, CredentialsSource)
    {
        let names = tokenIsCredentials ? ["token", "token-file", "auth-secret", "auth-key-file"] : ["token-file", "auth-secret", "auth-key-file"]
        let given = names.filter { parsed.has($0) }
        guard given.count <= 1 else {
            throw UsageError("give only one of \(names.dropLast().map { "--\($0)" }.joined(separator: ", ")) and --\(names.last!)")
        }
        var token: String?
        var source = CredentialsSource.fixed
        if tokenIsCredentials, let text = parsed.string("token") {
            token = text
        } else if let path = parsed.string("token-file") {
            guard let line = firstLine(ofFile: path) else { throw UsageError("cannot read --token-file \(path)") }
            token = line
            source = .tokenFile(path)
        } else if let secret = parsed.string("auth-secret") {
            guard !secret.isEmpty else { throw UsageError("--auth-secret must not be empty") }
            do {
                return (try LegacyToken.make(secret: secret, userID: user), .fixed)
            } catch {
                throw UsageError("--auth-secret: \(error.message)")
            }
        } else if let path = parsed.string("auth-key-file") {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError("cannot read --auth-key-file \(path)") }
            do {
                _ = try TokenKeyFile.parse(text)
            } catch {
                throw UsageError("--auth-key-file: \(path): \(error.message)")
            }
            source = .keyFile(path)
            guard let minted = source.credentials(user: user, device: device, now: Int64(Date().timeIntervalSince1970)) else {
                throw UsageError("--auth-key-file: cannot mint a token for \(user)/\(device)")
            }
            return (minted, source)
        }
        guard let token else { return (nil, .fixed) }
        guard !token.isEmpty, token.utf8.count <= ProtocolLimits.maxTokenBytes else {
            throw UsageError("the token must be 1-\(ProtocolLimits.maxTokenBytes) bytes")
        }
        return (Array(token.utf8), source)
    }

    /// `push-register`'s options; the library's own rules decide what may be registered.
    static func pushRegisterOptions(_ parsed: ParsedOptions) throws(UsageError) -> PushRegisterOptions {
        guard let kindName = parsed.string("kind") else { throw UsageError("push-register needs --kind apns-voip|apns|fcm|NAME") }
        guard !kindName.isEmpty, kindName.utf8.count <= ProtocolLimits.maxShortTextBytes else {
            throw UsageError("--kind must be 1-\(ProtocolLimits.maxShortTextBytes) bytes")
        }
        let token: [UInt8]
        switch (parsed.string("token"), parsed.string("token-text")) {
        case (let hex?, nil):
            guard let bytes = Self.hexBytes(hex) else { throw UsageError("--token must be hex digits, an even number of them") }
            token = bytes
        case (nil, let text?):
            token = Array(text.utf8)
        case (nil, nil):
            throw UsageError("push-register needs --token HEX or --token-text TEXT")
        default:
            throw UsageError("give --token or --token-text, not both")
        }
        guard token.count <= ProtocolLimits.maxTokenBytes else {
            throw UsageError("the push token is \(token.count) bytes, the limit is \(ProtocolLimits.maxTokenBytes)")
        }
        var options = PushRegisterOptions(kind: PushTokenKind(platform: kindName), token: token)
        if let name = parsed.string("environment") {
            guard let environment = PushEnvironment(rawValue: name) else { throw UsageError("--environment must be production or sandbox") }
            options.environment = environment
        }
        if let topic = parsed.string("topic") {
            guard topic.utf8.count <= ProtocolLimits.maxShortTextBytes else {
                throw UsageError("--topic must be at most \(ProtocolLimits.maxShortTextBytes) bytes")
            }
            options.topic = topic
        }
        if let problem = options.kind.registrationProblem(environment: options.environment, topic: options.topic) {
            throw UsageError(problem)
        }
        if let value = try seconds(parsed, "timeout", 0.1...86_400) { options.timeout = value }
        return options
    }

    /// "9a0F..." → bytes; nil unless every character is a hex digit and there is an even
    /// number of them. An empty string is no bytes.
    static func hexBytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return digit - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// The first line of a file, without surrounding blanks; nil if it cannot be read.
    static func firstLine(ofFile path: String) -> String? {
        guard let contents = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        return contents.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
    }

    /// User, device, call and message ids: 1-128 bytes of UTF-8 without control characters.
    static func identifier(_ text: String, what: String) throws(UsageError) -> String {
        guard !text.isEmpty, text.utf8.count <= ProtocolLimits.maxIdentifierBytes else {
            throw UsageError("\(what) must be 1-\(ProtocolLimits.maxIdentifierBytes) bytes, got '\(text)'")
        }
        guard !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw UsageError("\(what) must not contain control characters")
        }
        return text
    }

    static func seconds(_ parsed: ParsedOptions, _ name: String, _ range: ClosedRange<Double>) throws(UsageError) -> Duration? {
        try parsed.double(name, in: range).map { Duration.milliseconds(Int64(($0 * 1000).rounded())) }
    }
}
