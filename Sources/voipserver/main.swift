// voipserver: parse options, build the server, run it until SIGTERM/SIGINT, drain.
import SignalingServer
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

let arguments = Array(CommandLine.arguments.dropFirst())
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

// Block the shutdown signals in every thread (the loops inherit this mask) and wait for
// them here, so that no loop is interrupted mid-callback.
var shutdownSignals = sigset_t()
sigemptyset(&shutdownSignals)
sigaddset(&shutdownSignals, SIGTERM)
sigaddset(&shutdownSignals, SIGINT)
pthread_sigmask(SIG_BLOCK, &shutdownSignals, nil)
signal(SIGPIPE, SIG_IGN)

let logger = Logger(level: configuration.logLevel)
let server: SignalingServer
do {
    let store = try configuration.storage.openStore(logger: logger)
    server = try SignalingServer(configuration: configuration, logger: logger, store: store)
    try server.start()
} catch {
    logger.error("start_failed", ["error": "\(error)"])
    exit(70)
}

var received: Int32 = 0
sigwait(&shutdownSignals, &received)
logger.info("signal", ["signal": received == SIGTERM ? "SIGTERM" : "SIGINT"])
server.shutdown()
exit(0)
