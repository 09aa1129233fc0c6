import SignalingCrypto
import SignalingProtocol
import SignalingPush
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// The command line and configuration file of `voipserver`. Both use the same names: a
/// file line `ring-timeout = 45` means `--ring-timeout 45`. Precedence: built-in defaults,
/// then the file given with `--config`, then the command line.
public enum ServerOptions {
    public static let parser = CommandLineParser(
        command: "voipserver",
        usage: "voipserver [--listen HOST:PORT] [--config FILE] [options]",
        summary: """
            Persistent-connection signaling server for VoIP and messaging apps. Holds one long-lived, \
            mostly idle TCP connection per device and pushes call and message events down it at once. \
            Runs on its embedded defaults with no options at all.
            """,
        options: [
            OptionSpec("listen", value: "HOST:PORT|off", default: "0.0.0.0:7443 with authentication, 127.0.0.1:7443 without; off with --tls-listen", help: "Address and port to accept devices on in plain TCP; off for a TLS-only server. A non-loopback address without authentication needs --allow-anonymous."),
            OptionSpec("tls-listen", value: "HOST:PORT", help: "Also accept devices over TLS (ALPN vsig/1) on this address; without --listen the server is TLS-only. Needs --tls-cert and --tls-key. (default: off)"),
            OptionSpec("tls-cert", value: "FILE", help: "The TLS certificate chain (PEM, leaf first). Reloaded on SIGHUP."),
            OptionSpec("tls-key", value: "FILE", help: "The TLS certificate's private key (PEM). Reloaded on SIGHUP."),
            OptionSpec("tls-min-version", value: "1.2|1.3", default: "1.3", help: "The lowest TLS version accepted."),
            OptionSpec("tls-ticket-key-file", value: "FILE", default: "DATA-DIR/tls-ticket-key, made on first start; a random key per process with --store memory", help: "The session-ticket key: 160 hex digits (openssl rand -hex 80). Reloaded on SIGHUP."),
            OptionSpec("tls-proxy-protocol", help: "Every connection to the TLS listener starts with a PROXY protocol v2 header, before the TLS handshake (a TCP load balancer in front: haproxy send-proxy-v2)."),
            OptionSpec("config", value: "FILE", help: "Read options from FILE: one 'name = value' per line; '#' starts a comment at a line's start or after whitespace; values may be quoted."),
            OptionSpec("listen-backlog", value: "N", default: "net.core.somaxconn, or 4096", help: "Completed connections each loop's socket queues before accepting them (the kernel caps it at net.core.somaxconn)."),
            OptionSpec("workers", value: "N", default: "one per core but one, at least 1", help: "Event-loop threads."),
            OptionSpec("keepalive", value: "SECONDS", default: "600", help: "Keep-alive interval handed to devices; never below 600."),
            OptionSpec("max-keepalive", value: "SECONDS", default: "3600", help: "Longest keep-alive granted to a device that asks for more."),
            OptionSpec("ring-timeout", value: "SECONDS", default: "60", help: "How long an unanswered call rings (then: missed call)."),
            OptionSpec("call-grace", value: "SECONDS", default: "10", help: "How long a call survives a party's lost connection."),
            OptionSpec("max-frame", value: "BYTES", default: "65536", help: "Largest frame accepted."),
            OptionSpec("handshake-timeout", value: "SECONDS", default: "10", help: "Close connections that send no HELLO within this."),
            OptionSpec("max-pending", value: "EVENTS", default: "10000", help: "Unacknowledged events kept per device."),
            OptionSpec("max-pending-per-sender", value: "EVENTS", default: "half of --max-pending", help: "Unacknowledged messages one sender may have waiting for one device (senderQuotaExceeded past it)."),
            OptionSpec("sender-rate", value: "N", default: "0", help: "Messages and calls one user may send per second, bursts of 2N (rateLimited past it); 0 = no limit."),
            OptionSpec("memory-budget", value: "BYTES", default: "a quarter of the machine's memory", help: "Undelivered event data the server may hold in memory; past it messages and calls are refused (capacityExceeded)."),
            OptionSpec("session-ttl", value: "SECONDS", default: "86400", help: "How long a disconnected device's session stays resumable."),
            OptionSpec("event-ttl", value: "SECONDS", default: "2592000", help: "How long a device may stay away before it and its uncollected events are forgotten."),
            OptionSpec("store", value: "sqlite|memory|redis://HOST:PORT[,...]", default: "sqlite", help: "Keep pending events in SQLite (survive restarts), in memory only, or in Redis: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (put a password in the --config file, not on the command line). Several URLs separated by commas spread the users over those Redis instances by a hash of the user id; the first also holds the lease; the list's order and length are part of the data (docs/STORAGE.md, \"Several Redis instances\")."),
            OptionSpec("cluster", value: "redis://HOST:PORT[/DB][,...]", help: "Make this node a cluster member on that Redis (its store, as --store redis://..., a comma list included): every member serves devices; the one holding the store lease (on the first Redis) routes, the others relay their devices to it (docs/CLUSTER.md)."),
            OptionSpec("cluster-link", value: "redis://HOST:PORT[/DB]", help: "With --cluster: carry the relay between the nodes (pub/sub, presence keys) on this Redis instead of the store's, e.g. one without persistence, so that the store's fsyncs do not delay it (docs/CLUSTER.md). Default: the (first) --cluster Redis."),
            OptionSpec("redis-fsync", value: "always|everysec", default: "always", help: "With a Redis store: the weakest AOF fsync setting Redis may run with (checked at every connect); always survives a crash of Redis's machine, everysec may lose about its last second."),
            OptionSpec("redis-lease-ttl", value: "SECONDS", default: "10", help: "With a Redis store: the lease that makes one node per Redis database active; the others wait as standbys and one takes over within about this long after the active node dies. The active node steps down if it cannot refresh the lease in time (docs/CLUSTER.md)."),
            OptionSpec("redis-allow-volatile", help: "With a Redis store: start even if Redis's AOF is off or weaker than --redis-fsync (a warning; accepted messages can be lost when Redis stops)."),
            OptionSpec("data-dir", value: "DIR", default: "$STATE_DIRECTORY or ./voipserver-data", help: "Directory of the SQLite store (created if missing)."),
            OptionSpec("sync", value: "normal|full", default: "normal", help: "normal survives a process crash; full also a power loss (slower commits)."),
            OptionSpec("store-max-bytes", value: "BYTES", help: "Cap the store's size; past it messages are refused until space is freed."),
            OptionSpec("store-timeout", value: "SECONDS", default: "5", help: "A message the store cannot commit within this is refused (storeUnavailable)."),
            OptionSpec("delivery", value: "immediate|after-commit", default: "immediate", help: "Write events to connected devices at once, or only once committed (the sender's OK always waits for the commit)."),
            OptionSpec("commit-interval", value: "MILLISECONDS", default: "2", help: "How long the store writer gathers operations before it commits them together (delays the sender's OK, and with after-commit delivery the push)."),
            OptionSpec("dedup-window", value: "SECONDS", default: "86400", help: "How long message ids are remembered for de-duplication."),
            OptionSpec("dedup-capacity", value: "IDS", default: "1000000", help: "Most message ids remembered at once."),
            OptionSpec("max-queued-bytes", value: "BYTES", default: "1048576", help: "Unsent replies allowed for a client that does not read; past this its requests are not read until it catches up."),
            OptionSpec("slow-consumer-timeout", value: "SECONDS", default: "30", help: "Close (CLOSE slowConsumer) a client that reads nothing this long while data waits for it."),
            OptionSpec("max-connections-per-ip", value: "N", default: "10000", help: "Connections allowed from one IP address."),
            OptionSpec("proxy-protocol", help: "Every connection to the plain --listen listener starts with a PROXY protocol v2 header from the load balancer in front (haproxy: send-proxy-v2); per-IP limits and logs use the address it names. For the TLS listener: --tls-proxy-protocol."),
            OptionSpec("handshake-rate", value: "N", default: "20000", help: "Handshakes admitted per second (burst of the same size); 0 = unlimited."),
            OptionSpec("drain-retry-after", value: "SECONDS", default: "1", help: "On shutdown, tell devices to reconnect after this..."),
            OptionSpec("drain-jitter", value: "SECONDS", default: "30", help: "...plus a random delay up to this."),
            OptionSpec("drain-timeout", value: "SECONDS", default: "5", help: "How long shutdown waits for devices to read their CLOSE."),
            OptionSpec("auth-key-file", value: "FILE", help: "Require signed, expiring device tokens in HELLO, under the keys in FILE: lines 'KID SECRET', '#' comments (docs/AUTH.md). Reloaded on SIGHUP."),
            OptionSpec("auth-secret", value: "SECRET", help: "Legacy: also accept hex(HMAC-SHA256(SECRET, userId)) tokens, which never expire (prefer --auth-key-file)."),
            OptionSpec("auth-secret-file", value: "FILE", help: "Legacy: read the --auth-secret from FILE (first line)."),
            OptionSpec("allow-anonymous", help: "Accept devices on a non-loopback --listen address without authentication (any device may claim any user id)."),
            OptionSpec("push-gateway", value: "URL", help: "Send wake-ups for devices with no connection to this http:// URL (see docs/PUSH.md)."),
            OptionSpec("push-interval", value: "SECONDS", default: "10", help: "Least time between two wake-ups of one device (calls excepted)."),
            OptionSpec("push-timeout", value: "SECONDS", default: "5", help: "A wake-up request not answered within this fails and is retried."),
            OptionSpec("push-max-body", value: "BYTES", default: "4096", help: "Largest wake-up body sent."),
            OptionSpec("apns-key-file", value: "FILE", help: "Send wake-ups to APNs directly, signing provider tokens with this .p8 key (needs --apns-key-id, --apns-team-id, --apns-topic; docs/PUSH.md). Reloaded on SIGHUP, with the key id and team id."),
            OptionSpec("apns-key-id", value: "ID", help: "The APNs key's id (JWT kid)."),
            OptionSpec("apns-team-id", value: "ID", help: "The Apple developer team id (JWT iss)."),
            OptionSpec("apns-topic", value: "BUNDLE-ID", help: "The app's bundle id, for registrations that name no topic (VoIP pushes go to BUNDLE-ID.voip)."),
            OptionSpec("apns-url", value: "URL", default: "https://api.push.apple.com", help: "APNs production endpoint."),
            OptionSpec("apns-sandbox-url", value: "URL", default: "https://api.sandbox.push.apple.com", help: "APNs sandbox endpoint (tokens registered with environment sandbox)."),
            OptionSpec("apns-token-refresh", value: "SECONDS", default: "2400", help: "Sign a new APNs provider token this often (1200-3000)."),
            OptionSpec("fcm-service-account", value: "FILE", help: "Send wake-ups to FCM directly with this service-account JSON key (docs/PUSH.md). Reloaded on SIGHUP."),
            OptionSpec("fcm-url", value: "URL", default: "https://fcm.googleapis.com", help: "FCM endpoint (/v1/projects/PROJECT/messages:send is appended)."),
            OptionSpec("fcm-token-url", value: "URL", default: "the key file's token_uri", help: "OAuth2 token endpoint the service-account assertion is exchanged at."),
            OptionSpec("push-ca-file", value: "FILE", help: "Trust the CAs in this PEM file for APNs, FCM and the token endpoint instead of the system's."),
            OptionSpec("push-streams", value: "N", default: "100", help: "Requests in flight at once on the one HTTP/2 connection to each of APNs and FCM."),
            OptionSpec("tcp-user-timeout", value: "SECONDS", default: "30", help: "Kill connections whose sent data stays unacknowledged this long."),
            OptionSpec("tick", value: "SECONDS", default: "0.25", help: "Timer resolution of each event loop."),
            OptionSpec("busy-poll", value: "MICROSECONDS", default: "0", help: "Keep polling this long after activity instead of sleeping (lower latency, more CPU)."),
            OptionSpec("loop-slice", value: "MICROSECONDS", default: "0", help: "The scheduler slice each event loop thread asks for (100-100000; 0 = the kernel's default): a woken loop with a shorter slice preempts the thread on its CPU at once (Linux 6.12 and later)."),
            OptionSpec("loop-realtime", value: "auto|off|PRIORITY", default: "auto", help: "Run the event loop threads under SCHED_FIFO (auto: priority 1; or 1-99) while they keep up: no normal thread preempts a loop at work, and a woken loop takes its CPU at once. Through a ramp of connections, while a loop is saturated and while the hypervisor steals 1 % or more of the host's CPU time (and a minute after) they run at the normal policy. auto: only where the process may (CAP_SYS_NICE or an RLIMIT_RTPRIO), and never with --busy-poll; a priority that is refused logs a warning. off: the normal policy."),
            OptionSpec("loop-cpus", value: "LIST", help: "Run event loop i only on the i-th CPU of LIST (such as 1 or 2-5,7), for loops on cores of their own. (default: any CPU)"),
            OptionSpec("thread-placement", value: "auto|off", default: "off", help: "off: the scheduler places every thread; auto: with a store and more CPUs than loops, run loop i on the i-th CPU the process may use and the store's threads on the others, so that store work never delays a loop (a refusal is logged, not fatal; helps a busy host, costs a quiet one: docs/LOAD-TESTING.md). --loop-cpus wins over it."),
            OptionSpec("store-thread-priority", value: "auto|normal", default: "auto", help: "auto: with a store, run the store writer and the store's own threads at the idle scheduling policy (SCHED_IDLE), so that a loop woken by a request never waits for a commit's CPU, and at the normal one whenever the writer falls behind (nice 19 after 50 ms of waiting work, its own nice value after 250 ms, or at 50 ms when the writer has not run at all); only when the process may raise them back (root, CAP_SYS_NICE or LimitNICE=20), else as normal. normal: the normal policy (docs/OPERATIONS.md)."),
            OptionSpec("cpu-latency-limit", value: "MICROSECONDS", help: "While running, keep the host's CPUs able to wake within this (PM QoS; 0 = idle CPUs poll, lowest push latency on VMs, more power). Needs root."),
            OptionSpec("log-level", value: "LEVEL", default: "info", help: "debug, info, warn or error."),
            OptionSpec("log-format", value: "kv|json", default: "kv", help: "Log lines as key=value pairs or as one JSON object per line."),
            OptionSpec("admin-listen", value: "HOST:PORT", help: "Serve the admin HTTP API (/metrics, /healthz, /readyz, /v1/...) on this address; a bare PORT means 127.0.0.1:PORT. Without --admin-token-file only a loopback address is allowed. (default: off)"),
            OptionSpec("admin-token-file", value: "FILE", help: "Require 'Authorization: Bearer TOKEN' on the admin API (except /healthz and /readyz); TOKEN is FILE's first line."),
            OptionSpec("stats-interval", value: "SECONDS", default: "60", help: "Log a 'stats' line this often; 0 = never."),
        ],
        epilogue: """
            SIGNALS:
              SIGTERM, SIGINT   Drain: every device is told to reconnect after --drain-retry-after plus a random
                                share of --drain-jitter (so a restart is not a reconnect storm), then exit 0.
              SIGHUP            Reload: read the command line, --config, --auth-key-file and --auth-secret-file
                                again and put log-level, the token keys, the auth secret, max-pending,
                                max-connections-per-ip, handshake-rate, the TLS certificate and the
                                APNs/FCM keys in force; other changes are logged and
                                wait for a restart. A bad file changes nothing (logged as reload_failed).
                                Connections stay open.

            SUBCOMMANDS:
              voipserver token --user U [--device D] [--ttl 24h] --key-file FILE [--kid K]
                                Print a device token signed with a key of FILE (docs/AUTH.md).
              voipserver store-rebalance --from URLS --to URLS [--dry-run] [--force]
                                Move a Redis store's users onto a new list of instances, every node
                                stopped (docs/STORAGE.md, "Adding an instance").

            EXIT STATUS:
              0 after a clean drain, 64 for a usage or configuration error, 70 if the server cannot start.

            See docs/CONFIGURATION.md and docs/OPERATIONS.md.
            """)

    /// The push services: the webhook gateway, APNs and FCM, each optional (nil: none).
    /// With `running` (a reload), a key file that cannot be read or parsed keeps the
    /// running service's signing material and is listed in `refusedCredentials` instead
    /// of failing the whole reload.
    static func pushConfiguration(
        _ options: ParsedOptions, running: PushGatewayConfiguration?, refusedCredentials: inout [RefusedCredential],
        seconds: (String, ClosedRange<Double>) throws(UsageError) -> Duration?
    ) throws(UsageError) -> PushGatewayConfiguration? {
        let apnsOptions = ["apns-key-file", "apns-key-id", "apns-team-id", "apns-topic", "apns-url", "apns-sandbox-url", "apns-token-refresh"]
        let fcmOptions = ["fcm-service-account", "fcm-url", "fcm-token-url"]
        let sharedOptions = ["push-interval", "push-timeout", "push-max-body", "push-ca-file", "push-streams"]
        var push = PushGatewayConfiguration()
        if let url = options.string("push-gateway") { push.endpoint = try GatewayEndpoint(url: url) }
        if let path = options.string("apns-key-file") {
            guard let keyID = options.string("apns-key-id"), let teamID = options.string("apns-team-id"),
                let topic = options.string("apns-topic")
            else { throw UsageError("--apns-key-file needs --apns-key-id, --apns-team-id and --apns-topic") }
            var apns: APNsConfiguration
            do throws(UsageError) {
                apns = try APNsConfiguration(keyFile: path, keyID: keyID, teamID: teamID, defaultTopic: topic)
            } catch {
                // On a reload a bad key file keeps the running key (and its id and team).
                guard let kept = running?.apns else { throw UsageError("--apns-key-file \(error.message)") }
                refusedCredentials.append(.init(option: "apns-key-file", detail: error.message))
                apns = APNsConfiguration(key: kept.key, keyID: kept.keyID, teamID: kept.teamID, defaultTopic: topic).withCredentials(of: kept)
            }
            if let url = options.string("apns-url") { apns.productionURL = url }
            if let url = options.string("apns-sandbox-url") { apns.sandboxURL = url }
            if let value = try seconds("apns-token-refresh", 1200...3000) { apns.tokenRefreshInterval = value }
            push.apns = apns
        } else if let stray = apnsOptions.first(where: options.has) {
            throw UsageError("--\(stray) needs --apns-key-file")
        }
        if let path = options.string("fcm-service-account") {
            let account: FCMConfiguration.ServiceAccount
            do throws(UsageError) {
                account = try FCMConfiguration.ServiceAccount(file: path)
            } catch {
                guard let kept = running?.fcm else { throw UsageError("--fcm-service-account \(error.message)") }
                refusedCredentials.append(.init(option: "fcm-service-account", detail: error.message))
                account = kept.account
            }
            var fcm = FCMConfiguration(account: account)
            if let url = options.string("fcm-url") { fcm.messagesURL = url }
            if let url = options.string("fcm-token-url") { fcm.tokenURL = url }
            push.fcm = fcm
        } else if let stray = fcmOptions.first(where: options.has) {
            throw UsageError("--\(stray) needs --fcm-service-account")
        }
        guard push.endpoint != nil || push.apns != nil || push.fcm != nil else {
            if let stray = sharedOptions.first(where: options.has) {
                throw UsageError("--\(stray) needs a push service: --push-gateway, --apns-key-file or --fcm-service-account")
            }
            return nil
        }
        if let value = try seconds("push-interval", 0...86_400) { push.minimumInterval = value }
        if let value = try seconds("push-timeout", 0.001...3600) { push.requestTimeout = value }
        if let value = try options.int("push-max-body", in: 64...(1 << 20)) { push.maxBodyBytes = value }
        if let value = try options.int("push-streams", in: 1...10_000) { push.maxConcurrentStreams = value }
        if let path = options.string("push-ca-file") {
            guard readTextFile(path) != nil else { throw UsageError("--push-ca-file: cannot read \(path)") }
            push.caFile = path
        }
        try push.validate()
        return push
    }

    /// `redis://...[,redis://...]`: the URLs themselves are parsed when the store opens.
    private static func isRedisList(_ text: String) -> Bool {
        text.split(separator: ",", omittingEmptySubsequences: false).allSatisfy { $0.drop { $0 == " " }.hasPrefix("redis://") }
    }

    /// Builds the configuration from the command line (and the file it names). On a
    /// reload, pass the `running` configuration: a push key file that has gone bad then
    /// keeps the running key (`refusedPushCredentials`) rather than failing everything.
    public static func configuration(
        from arguments: [String], running: ServerConfiguration? = nil
    ) throws(UsageError) -> (ServerConfiguration, helpRequested: Bool) {
        let commandLine = try parser.parse(arguments)
        if commandLine.helpRequested { return (ServerConfiguration(), true) }
        guard commandLine.positionals.isEmpty else {
            throw UsageError("unexpected argument '\(commandLine.positionals[0])'")
        }
        var merged = ParsedOptions()
        var file = ConfigurationFile(path: "")
        if let path = commandLine.string("config") {
            file = try parseFile(path)
            merged = file.options
        }
        for (name, values) in commandLine.values {
            merged.values[name] = values
            file.lines[name] = nil  // the command line wins: a mistake in it is not the file's
        }
        do {
            return (try build(merged, running: running), false)
        } catch {
            throw file.locate(error)
        }
    }

    /// The options a configuration file sets, and the line each one is on.
    struct ConfigurationFile {
        let path: String
        var options = ParsedOptions()
        var lines: [String: Int] = [:]

        /// Prefixes `file:line:` to an error about an option this file set. Errors name
        /// their option (`--ring-timeout must be...`, `max-frame must be...`); the longest
        /// name found wins, so `auth-secret-file` is not taken for `auth-secret`.
        func locate(_ error: UsageError) -> UsageError {
            let named = lines.keys.filter { error.message.contains("--\($0)") || error.message.hasPrefix("\($0) ") }
            guard let name = named.max(by: { $0.count < $1.count }), let line = lines[name] else { return error }
            return UsageError("\(path):\(line): \(error.message)")
        }
    }

    /// Reads `name = value` lines (docs/CONFIGURATION.md, "The file"):
    /// - `#` starts a comment at the start of a line or after whitespace; elsewhere it is
    ///   part of the value (`auth-secret = abc#def` is `abc#def`).
    /// - A value may be quoted, `"..."` or `'...'`; the quotes are not part of it. Inside
    ///   double quotes `\"` and `\\` stand for `"` and `\`, and no other escape exists;
    ///   single quotes take everything literally.
    /// - A name given twice is an error. Every error names the file and the line.
    static func parseFile(_ path: String) throws(UsageError) -> ConfigurationFile {
        guard let text = readTextFile(path) else { throw UsageError("cannot read configuration file \(path)") }
        var file = ConfigurationFile(path: path)
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            func failure(_ message: String) -> UsageError { UsageError("\(path):\(number): \(message)") }
            let line = Substring(rawLine).trimmingWhitespace()
            guard !line.isEmpty, line.first != "#" else { continue }
            guard let equals = line.firstIndex(of: "=") else { throw failure("expected 'name = value'") }
            let name = String(line[..<equals].trimmingWhitespace())
            guard let spec = parser.options.first(where: { $0.name == name }), name != "config" else {
                throw failure("unknown option '\(name)'")
            }
            if let first = file.lines[name] { throw failure("'\(name)' is already set on line \(first)") }
            let value: String
            do {
                value = try parseValue(line[line.index(after: equals)...])
            } catch {
                throw failure("\(name): \(error.message)")
            }
            file.lines[name] = number
            if spec.isFlag {
                // `allow-anonymous = false` must not mean true.
                guard value == "true" || value == "false" else { throw failure("\(name) takes true or false") }
                if value == "false" { continue }
            }
            file.options.values[name] = [spec.isFlag ? "true" : value]
        }
        return file
    }

    /// The value after `=`: quoted or bare, up to a comment (see `parseFile`).
    static func parseValue(_ rest: Substring) throws(UsageError) -> String {
        let text = rest.trimmingWhitespace()
        guard let quote = text.first, quote == "\"" || quote == "'" else {
            // Bare: a `#` ends it only at its start after whitespace, or after whitespace.
            var value = ""
            var previous: Character = rest.first?.isWhitespace == true ? " " : "="
            for character in text {
                if character == "#" && previous.isWhitespace { break }
                value.append(character)
                previous = character
            }
            return String(Substring(value).trimmingWhitespace())
        }
        var value = ""
        var index = text.index(after: text.startIndex)
        var closed = false
        while index < text.endIndex {
            let character = text[index]
            index = text.index(after: index)
            if character == quote { closed = true; break }
            if character == "\\" && quote == "\"" {
                guard index < text.endIndex else { break }
                let escaped = text[index]
                guard escaped == "\"" || escaped == "\\" else {
                    throw UsageError("unknown escape '\\\(escaped)' in a quoted value (only \\\" and \\\\ exist)")
                }
                value.append(escaped)
                index = text.index(after: index)
                continue
            }
            value.append(character)
        }
        guard closed else { throw UsageError("the value has no closing \(quote)") }
        let after = text[index...]
        guard after.isEmpty || (after.first!.isWhitespace && after.trimmingWhitespace().first.map { $0 == "#" } ?? true) else {
            throw UsageError("unexpected text after the closing \(quote)")
        }
        return value
    }

    static func build(_ options: ParsedOptions, running: ServerConfiguration? = nil) throws(UsageError) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        if let listen = options.string("listen") {
            if listen == "off" {
                configuration.plainListener = false
            } else {
                (configuration.host, configuration.port) = try address("listen", listen)
            }
        }
        if let workers = try options.int("workers", in: 1...256) { configuration.workers = workers }
        if let backlog = try options.int("listen-backlog", in: 1...Int(Int32.max)) { configuration.listenBacklog = backlog }

        let keepAlive = try options.int("keepalive", in: 1...86_400).map(UInt32.init) ?? configuration.keepAlive.defaultInterval
        let maxKeepAlive = try options.int("max-keepalive", in: 1...86_400).map(UInt32.init)
            ?? max(configuration.keepAlive.maximumInterval, keepAlive)
        do {
            configuration.keepAlive = try KeepAlivePolicy(defaultInterval: keepAlive, maximumInterval: maxKeepAlive)
        } catch {
            throw UsageError("--keepalive: \(error)")
        }

        func seconds(_ name: String, _ range: ClosedRange<Double>) throws(UsageError) -> Duration? {
            try options.double(name, in: range).map { Duration.milliseconds(Int64(($0 * 1000).rounded())) }
        }
        if let value = try seconds("ring-timeout", 1...3600) { configuration.ringTimeout = value }
        if let value = try seconds("call-grace", 0...3600) { configuration.callGrace = value }
        if let value = try seconds("handshake-timeout", 1...300) { configuration.handshakeTimeout = value }
        if let value = try seconds("session-ttl", 0...(86_400 * 365)) { configuration.sessionTTL = value }
        if let value = try seconds("event-ttl", 0...(86_400 * 3650)) { configuration.eventTTL = value }
        if let value = try seconds("store-timeout", 0.01...3600) { configuration.storeTimeout = value }
        if let mode = options.string("store") {
            if mode.hasPrefix("redis://") {
                guard Self.isRedisList(mode) else { throw UsageError("--store redis://... takes redis:// URLs separated by commas") }
                configuration.storage.mode = .redis
                configuration.storage.redisURL = mode
            } else {
                guard let parsed = StorageConfiguration.Mode(rawValue: mode), parsed != .redis else {
                    throw UsageError("--store must be sqlite, memory or a redis:// URL")
                }
                configuration.storage.mode = parsed
            }
        }
        if let cluster = options.string("cluster") {
            guard Self.isRedisList(cluster) else { throw UsageError("--cluster must be a redis:// URL, or several separated by commas") }
            if let store = options.string("store"), store != cluster {
                throw UsageError("--cluster \(cluster) and --store \(store) name different stores: a cluster member's store is its --cluster Redis (leave --store out)")
            }
            configuration.storage.mode = .redis
            configuration.storage.redisURL = cluster
            configuration.storage.cluster = true
        }
        if let link = options.string("cluster-link") {
            guard configuration.storage.cluster else { throw UsageError("--cluster-link needs --cluster") }
            guard link.hasPrefix("redis://"), !link.contains(",") else { throw UsageError("--cluster-link must be one redis:// URL") }
            configuration.storage.clusterLinkURL = link
        }
        if let fsync = options.string("redis-fsync") {
            guard let parsed = StorageConfiguration.RedisFsync(rawValue: fsync) else { throw UsageError("--redis-fsync must be always or everysec") }
            configuration.storage.redisFsync = parsed
        }
        configuration.storage.redisAllowVolatile = options.has("redis-allow-volatile")
        if let value = try seconds("redis-lease-ttl", 0.3...600) { configuration.storage.redisLeaseTTL = value }
        if configuration.storage.mode == .redis {
            // Settings of the SQLite store, which a Redis store would silently ignore.
            for name in ["sync", "store-max-bytes"] where options.has(name) {
                throw UsageError("--\(name) is for the SQLite store; with Redis, set its AOF (--redis-fsync) and maxmemory")
            }
        } else if options.has("redis-fsync") || options.has("redis-allow-volatile") || options.has("redis-lease-ttl") {
            throw UsageError("--redis-fsync, --redis-allow-volatile and --redis-lease-ttl need --store redis://... or --cluster")
        }
        if let directory = options.string("data-dir") {
            guard !directory.isEmpty else { throw UsageError("--data-dir must not be empty") }
            configuration.storage.directory = directory
        }
        if let sync = options.string("sync") {
            guard let parsed = StorageConfiguration.Synchronous(rawValue: sync) else { throw UsageError("--sync must be normal or full") }
            configuration.storage.synchronous = parsed
        }
        if let delivery = options.string("delivery") {
            guard let parsed = Delivery(rawValue: delivery) else { throw UsageError("--delivery must be immediate or after-commit") }
            configuration.delivery = parsed
        }
        if let bytes = try options.int("store-max-bytes", in: 65_536...Int.max) { configuration.storage.maxBytes = bytes }
        if let value = try seconds("dedup-window", 0...(86_400 * 365)) { configuration.dedupWindow = value }
        if let value = try seconds("drain-retry-after", 0...3600) { configuration.drainRetryAfter = value }
        if let value = try seconds("drain-jitter", 0...3600) { configuration.drainJitter = value }
        if let value = try seconds("drain-timeout", 0...600) { configuration.drainTimeout = value }
        if let value = try seconds("tcp-user-timeout", 1...3600) { configuration.tcpUserTimeout = value }
        if let value = try seconds("slow-consumer-timeout", 1...3600) { configuration.slowConsumerTimeout = value }
        if let value = try seconds("tick", 0.001...1) { configuration.tickInterval = value }
        if let value = try seconds("stats-interval", 0...86_400) { configuration.statsInterval = value }
        if let value = try options.double("commit-interval", in: 0...1000) {
            configuration.commitInterval = .microseconds(Int64((value * 1000).rounded()))
        }
        if let value = try options.int("busy-poll", in: 0...1_000_000) { configuration.busyPoll = .microseconds(value) }
        if let value = options.string("loop-realtime") {
            switch value {
            case "auto": configuration.loopRealtime = .auto
            case "off", "0": configuration.loopRealtime = .off
            default:
                guard let priority = Int32(value), (1...99).contains(priority) else {
                    throw UsageError("--loop-realtime must be auto, off or a priority from 1 to 99")
                }
                configuration.loopRealtime = .priority(priority)
            }
        }
        if let value = try options.int("loop-slice", in: 0...100_000) {
            guard value == 0 || value >= 100 else { throw UsageError("--loop-slice must be 0, or 100 to 100000 microseconds (the kernel's range)") }
            configuration.loopSlice = .microseconds(value)
        }
        if let value = try options.int("cpu-latency-limit", in: 0...1_000_000) { configuration.cpuLatencyLimit = .microseconds(value) }
        if let list = options.string("loop-cpus") {
            do {
                configuration.loopCPUs = try CPUList.parse(list)
            } catch {
                throw UsageError("--loop-cpus: \(error.message)")
            }
        }
        if let placement = options.string("thread-placement") {
            guard let parsed = ThreadPlacementMode(rawValue: placement) else { throw UsageError("--thread-placement must be auto or off") }
            configuration.threadPlacement = parsed
        }
        if let priority = options.string("store-thread-priority") {
            guard let parsed = StoreThreadPriorityMode(rawValue: priority) else { throw UsageError("--store-thread-priority must be auto or normal") }
            configuration.storeThreadPriority = parsed
        }
        if let value = try options.int("max-frame", in: 256...(16 << 20)) { configuration.maxFrameLength = value }
        if let value = try options.int("max-pending", in: 1...10_000_000) { configuration.maxPendingEvents = value }
        if let value = try options.int("max-pending-per-sender", in: 1...10_000_000) { configuration.maxPendingPerSender = value }
        if let value = try options.int("sender-rate", in: 0...10_000_000) { configuration.senderRate = value }
        if let value = try options.int("memory-budget", in: (1 << 20)...Int.max) { configuration.memoryBudget = value }
        if let value = try options.int("dedup-capacity", in: 1...100_000_000) { configuration.dedupCapacity = value }
        if let value = try options.int("max-queued-bytes", in: 256...(1 << 30)) { configuration.maxQueuedBytes = value }
        if let value = try options.int("max-connections-per-ip", in: 1...10_000_000) { configuration.maxConnectionsPerAddress = value }
        if let value = try options.int("handshake-rate", in: 0...10_000_000) { configuration.handshakeRate = value }

        if options.has("auth-secret") && options.has("auth-secret-file") {
            throw UsageError("give --auth-secret or --auth-secret-file, not both")
        }
        if let secret = options.string("auth-secret") {
            guard !secret.isEmpty else { throw UsageError("--auth-secret must not be empty") }
            configuration.authSecret = secret
        }
        if let path = options.string("auth-secret-file") {
            guard let text = readTextFile(path),
                  let line = text.split(separator: "\n").first.map({ String($0.trimmingWhitespace()) }), !line.isEmpty
            else { throw UsageError("--auth-secret-file: cannot read a secret from \(path)") }
            configuration.authSecret = line
        }
        if let path = options.string("auth-key-file") {
            configuration.authKeys = try readKeyFile(path, option: "auth-key-file")
        }
        configuration.allowAnonymous = options.has("allow-anonymous")
        configuration.proxyProtocol = options.has("proxy-protocol")
        configuration.tls = try tlsListener(options, configuration.storage)
        // Asking for a TLS listener alone means TLS only, as a Mosquitto listener
        // replaces the default one: a plain port nobody asked for would carry tokens in clear.
        if configuration.tls != nil && !options.has("listen") { configuration.plainListener = false }
        // Mosquitto 2.0's rule: without authentication, only this host can connect unless
        // an address is asked for (and that needs --allow-anonymous, see `validate`).
        if !options.has("listen") && configuration.requiresAuthentication { configuration.host = "0.0.0.0" }
        configuration.pushGateway = try pushConfiguration(
            options, running: running?.pushGateway, refusedCredentials: &configuration.refusedPushCredentials, seconds: seconds)
        if let format = options.string("log-format") {
            guard let parsed = LogFormat(rawValue: format) else { throw UsageError("--log-format must be kv or json") }
            configuration.logFormat = parsed
        }
        if let listen = options.string("admin-listen") {
            var host = "127.0.0.1", portText = Substring(listen)
            if let colon = listen.lastIndex(of: ":") {
                host = String(listen[..<colon])
                portText = listen[listen.index(after: colon)...]
                if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
                if host.isEmpty { host = "127.0.0.1" }
            }
            guard let port = UInt16(portText) else { throw UsageError("--admin-listen expects HOST:PORT or PORT, got '\(listen)'") }
            configuration.admin = AdminConfiguration(host: host, port: port)
        }
        if let path = options.string("admin-token-file") {
            guard configuration.admin != nil else { throw UsageError("--admin-token-file needs --admin-listen") }
            guard let text = readTextFile(path),
                  let line = text.split(separator: "\n").first.map({ String($0.trimmingWhitespace()) }), !line.isEmpty
            else { throw UsageError("--admin-token-file: cannot read a token from \(path)") }
            configuration.admin?.token = line
        }
        if let level = options.string("log-level") {
            guard let parsed = LogLevel(name: level) else { throw UsageError("--log-level must be debug, info, warn or error") }
            configuration.logLevel = parsed
        }
        try configuration.validate()
        return configuration
    }
}

extension ServerOptions {
    /// A listener's `HOST:PORT`, `[v6]:PORT`, or `:PORT` for every interface.
    static func address(_ name: String, _ text: String) throws(UsageError) -> (host: String, port: UInt16) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
            throw UsageError("--\(name) expects HOST:PORT, got '\(text)'")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host.isEmpty ? "0.0.0.0" : host, port)
    }

    /// The TLS listener the `tls-*` options describe, nil without `--tls-listen` (the
    /// other `tls-*` options alone are a mistake).
    static func tlsListener(_ options: ParsedOptions, _ storage: StorageConfiguration) throws(UsageError) -> TLSListenerConfiguration? {
        guard let listen = options.string("tls-listen") else {
            if let stray = ["tls-cert", "tls-key", "tls-min-version", "tls-ticket-key-file", "tls-proxy-protocol"].first(where: options.has) {
                throw UsageError("--\(stray) needs --tls-listen")
            }
            return nil
        }
        let (host, port) = try address("tls-listen", listen)
        guard let chain = options.string("tls-cert"), let key = options.string("tls-key") else {
            throw UsageError("--tls-listen needs --tls-cert and --tls-key (the certificate chain and its private key, PEM)")
        }
        var tls = TLSListenerConfiguration(host: host, port: port, certificateChainFile: chain, privateKeyFile: key)
        if let version = options.string("tls-min-version") {
            guard let parsed = TLSVersion(rawValue: version) else { throw UsageError("--tls-min-version must be 1.2 or 1.3") }
            tls.minimumVersion = parsed
        }
        if let path = options.string("tls-ticket-key-file") {
            tls.ticketKey = .file(path)
        } else if storage.mode == .sqlite {
            tls.ticketKey = .dataDirectory(storage.directory + "/" + TicketKeySource.fileName)
        }
        tls.proxyProtocol = options.has("tls-proxy-protocol")
        return tls
    }

    /// The keys of a token key file, or a usage error naming the option, the file and the line.
    public static func readKeyFile(_ path: String, option: String) throws(UsageError) -> [TokenKey] {
        guard let text = readTextFile(path) else { throw UsageError("--\(option): cannot read \(path)") }
        do {
            return try TokenKeyFile.parse(text)
        } catch {
            throw UsageError("--\(option): \(path): \(error.message)")
        }
    }
}

extension Substring {
    func trimmingWhitespace() -> Substring {
        var result = self
        while let first = result.first, first.isWhitespace { result.removeFirst() }
        while let last = result.last, last.isWhitespace { result.removeLast() }
        return result
    }
}
