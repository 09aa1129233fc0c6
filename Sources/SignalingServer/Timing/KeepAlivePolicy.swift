import SignalingProtocol

/// The keep-alive rules of the product, in one place:
/// - the interval handed to a client is never below 600 s (iOS's minimum, and the reason
///   an idle phone can sleep);
/// - a client may ask for more, up to the server's maximum;
/// - the server drops a connection only after 1.5 × the interval of silence (MQTT's rule),
///   never earlier, so a client whose handler runs a little late is never dropped.
public struct KeepAlivePolicy: Sendable, Equatable {
    /// The interval given to clients that ask for none (seconds, ≥ 600).
    public let defaultInterval: UInt32
    /// The largest interval granted to a client that asks for more.
    public let maximumInterval: UInt32

    public enum ConfigurationError: Error, Equatable, CustomStringConvertible {
        case belowMinimum(UInt32)
        case maximumBelowDefault(default: UInt32, maximum: UInt32)

        public var description: String {
            switch self {
            case .belowMinimum(let value):
                return "keep-alive interval \(value) s is below the minimum of \(ProtocolLimits.minimumKeepAliveSeconds) s"
            case .maximumBelowDefault(let def, let max):
                return "maximum keep-alive \(max) s is below the keep-alive interval \(def) s"
            }
        }
    }

    /// Refuses intervals under 600 s: the floor is part of the product, not a default.
    public init(defaultInterval: UInt32 = 600, maximumInterval: UInt32 = 3600) throws(ConfigurationError) {
        guard defaultInterval >= ProtocolLimits.minimumKeepAliveSeconds else { throw .belowMinimum(defaultInterval) }
        guard maximumInterval >= defaultInterval else {
            throw .maximumBelowDefault(default: defaultInterval, maximum: maximumInterval)
        }
        self.defaultInterval = defaultInterval
        self.maximumInterval = maximumInterval
    }

    public enum Decision: Equatable, Sendable {
        /// Use this interval; close after `idleTimeout` seconds of silence.
        case grant(interval: UInt32, idleTimeout: UInt32)
        /// Refuse the handshake.
        case refuse(ProtocolViolation)
    }

    /// What to give a client that asked for `requested` seconds (0 = no preference).
    public func negotiate(requested: UInt32) -> Decision {
        if requested != 0 && requested < ProtocolLimits.minimumKeepAliveSeconds {
            return .refuse(ProtocolViolation(
                .keepAliveTooShort,
                "keep-alive \(requested) s refused: the minimum is \(ProtocolLimits.minimumKeepAliveSeconds) s"))
        }
        let interval = requested == 0 ? defaultInterval : min(max(requested, defaultInterval), maximumInterval)
        return .grant(interval: interval, idleTimeout: Self.idleTimeout(forInterval: interval))
    }

    /// ⌈1.5 × interval⌉.
    public static func idleTimeout(forInterval interval: UInt32) -> UInt32 {
        interval + (interval + 1) / 2
    }
}
