import SignalingProtocol
import SignalingSupport

/// What every event loop of one server shares. Immutable, or internally synchronised.
final class ServerContext: Sendable {
    let configuration: ServerConfiguration
    let clock: any Clock
    let logger: Logger
    let switchboard: Switchboard
    let admission: AdmissionControl
    let counters = StatisticsCounters()
    /// Time zero of the server's second-granularity timeline (connection stamps).
    let startInstant: Instant

    init(configuration: ServerConfiguration, clock: any Clock, logger: Logger, journaling: Bool) {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        let now = clock.now()
        self.switchboard = Switchboard(configuration: configuration.switchboard, epoch: now, journaling: journaling)
        self.startInstant = now
        self.admission = AdmissionControl(
            maxConnectionsPerAddress: configuration.maxConnectionsPerAddress,
            handshakeRate: configuration.handshakeRate, now: now)
    }

    /// Passes a push wake-up request on (no gateway yet: logged at debug level).
    func requestWakeUp(_ effect: SwitchboardEffect) {
        guard case .wakeUp(let user, let device, let type, let pending, _) = effect else { return }
        logger.debug("wake_up", ["user": user, "device": device, "event": type, "pending": pending])
    }

    /// Whole seconds since the server started, rounded down.
    func seconds(at instant: Instant) -> UInt32 {
        (instant - startInstant).seconds.isFinite ? UInt32(clamping: Int((instant - startInstant).seconds)) : 0
    }

    /// A duration in whole seconds, rounded up.
    static func wholeSeconds(_ duration: Duration) -> UInt32 {
        UInt32(clamping: Int(duration.seconds.rounded(.up)))
    }
}
