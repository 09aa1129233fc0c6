// voipserver: parse options, build the server, run it until SIGTERM/SIGINT, drain;
// SIGHUP reloads what can change at run time. `voipserver token ...` mints a device token;
// `voipserver store-rebalance ...` moves a Redis store's users onto a new list of instances.
import SignalingServer
import SignalingStoreRedis
import SignalingSupport
import SignalingSystemd
#if canImport(Glibc)
import Glibc
#endif

let arguments = Array(CommandLine.arguments.dropFirst())
/// Prints a subcommand's outcome and exits with its status.
func finish(_ outcome: CommandOutcome) -> Never {
    if !outcome.output.isEmpty { StandardStreams.output(outcome.output) }
    if !outcome.error.isEmpty { StandardStreams.error(outcome.error) }
    exit(outcome.status)
}
switch arguments.first {
case "token": finish(TokenCommand.run(Array(arguments.dropFirst()), now: Int64(SystemClock().wallMilliseconds() / 1000)))
case "store-rebalance": finish(StoreRebalanceCommand.run(Array(arguments.dropFirst()), logger: Logger(level: .info)))
default: break
}
if (try? ServerOptions.parser.parse(arguments))?.versionRequested == true {
    StandardStreams.output(ProductVersion.line(for: "voipserver"))
    exit(0)
}

let configuration: ServerConfiguration
do {
    let (parsed, helpRequested) = try ServerOptions.configuration(from: arguments)
    if helpRequested {
        StandardStreams.output(ServerOptions.parser.helpText)
        exit(0)
    }
    configuration = parsed
} catch {
    StandardStreams.error("voipserver: \(error)\nTry 'voipserver --help'.\n")
    exit(64)
}

// Block the signals the server handles in every thread (the loops inherit this mask) and
// wait for them here, so that no loop is interrupted mid-callback. SIGHUP is among them:
// its default action would kill the server (exit 129, no drain).
var handledSignals = sigset_t()
sigemptyset(&handledSignals)
sigaddset(&handledSignals, SIGTERM)
sigaddset(&handledSignals, SIGINT)
sigaddset(&handledSignals, SIGHUP)
pthread_sigmask(SIG_BLOCK, &handledSignals, nil)
signal(SIGPIPE, SIG_IGN)

let logger = Logger(level: configuration.logLevel, format: configuration.logFormat)
let server: Node
do {
    server = try Node.start(configuration, logger: logger)
} catch {
    logger.error("start_failed", ["error": "\(error)"])
    exit(70)
}
// Type=notify: systemd counts the service as started only now, with the listeners up.
ServiceManager.ready(status: server.status)

var received: Int32 = 0
while true {
    sigwait(&handledSignals, &received)
    guard received == SIGHUP else { break }
    // Read the command line, the --config file and the key and secret files again, with the
    // same precedence as at start. A mistake keeps everything as it is.
    logger.info("signal", ["signal": "SIGHUP"])
    ServiceManager.reloading()
    do {
        let (reloaded, _) = try ServerOptions.configuration(from: arguments, running: server.configuration)
        server.reload(reloaded)
    } catch {
        logger.error("reload_failed", ["error": error.message, "detail": "the running configuration stays"])
    }
    ServiceManager.ready(status: server.status)
}
logger.info("signal", ["signal": received == SIGTERM ? "SIGTERM" : "SIGINT"])
ServiceManager.stopping()
server.shutdown()
exit(0)
