import SignalingClient
import SignalingCrypto
import SignalingSupport
import SignalingTLS

/// What every mode needs: where the servers are, who we are, how to report.
public struct CommonOptions: Sendable, Equatable {
    /// `--server`: the servers in the order of preference; the client moves on to the next
    /// when one fails (docs/CLIENT.md, "Several servers").
    public var servers: [ServerAddress]
    public var user: String
    public var device: String
    /// HELLO credentials: the token given, read from a file, or computed from a secret.
    public var credentials: [UInt8]?
    /// Where fresh credentials come from when the server asks for them (CLOSE
    /// `tokenExpired` or `unknownKey`).
    public var credentialsSource = CredentialsSource.fixed
    /// `--tls` and its options; nil: plain TCP.
    public var tls: TLSClientConfiguration?
    /// One JSON object per line on stdout instead of text.
    public var json = false
    /// Deadline of the first connect (TCP, HELLO, WELCOME); also of automatic reconnects.
    public var connectTimeout: Duration = .seconds(10)
    /// The client library's log on stderr; nil = silent.
    public var logLevel: LogLevel?
    public var media = MediaOptions()

    public init(servers: [ServerAddress], user: String, device: String) {
        self.servers = servers
        self.user = user
        self.device = device
    }
}

/// Where `voipclient` gets fresh credentials when the server refuses a token with action
/// `refreshCredentials` (docs/VOIPCLIENT.md).
public enum CredentialsSource: Sendable, Equatable {
    /// `--token` or `--auth-secret`: nothing fresher exists; the client retries with back-off.
    case fixed
    /// `--token-file`: read the file again (a backend or a script replaces it).
    case tokenFile(String)
    /// `--auth-key-file`: read the key file again and mint a new token for this device
    /// with its last key (so a rotation of a shared key file is followed).
    case keyFile(String)

    /// The credentials this source gives now (nil: none).
    public func credentials(user: String, device: String, now unixSeconds: Int64) -> [UInt8]? {
        switch self {
        case .fixed:
            return nil
        case .tokenFile(let path):
            return VoipClientOptions.firstLine(ofFile: path).flatMap { $0.isEmpty ? nil : Array($0.utf8) }
        case .keyFile(let path):
            guard let text = readTextFile(path), let key = try? TokenKeyFile.parse(text).last else { return nil }
            let claims = DeviceTokenClaims(
                userID: user, deviceID: device, expiresAt: unixSeconds + CredentialsSource.mintedLifetimeSeconds)
            return (try? DeviceToken.mint(claims, key: key)).map { Array($0.utf8) }
        }
    }

    /// How long a token `voipclient --auth-key-file` mints stays valid: an hour.
    public static let mintedLifetimeSeconds: Int64 = 3600
}

/// The call-path probe (docs/VOIPCLIENT.md, "The call-path probe").
public struct MediaOptions: Sendable, Equatable {
    /// Address to bind the UDP socket to and to announce in the offer/answer; nil = the
    /// local address of the signaling connection.
    public var address: String?
    /// 0 = any free port.
    public var port: UInt16 = 0
    /// Probe packets each side sends; 0 = no probe (the offer/answer still carries the
    /// address, and the socket still echoes the peer's packets).
    public var packets = 50
    public var interval: Duration = .milliseconds(20)
    /// nil: report the probe, never fail on it. Otherwise the largest acceptable loss;
    /// `--require-media` alone means "anything but total loss" (under 100 %).
    public var maximumLossPercent: Double?

    public init() {}
}

/// `call CALLEE`.
public struct CallOptions: Sendable, Equatable {
    public var callee: String
    /// Hang up this long after the answer (and not before the probe is complete).
    public var hangupAfter: Duration = .zero
    /// Bounds the whole call, from the invitation: cancel (or hang up) and exit 4.
    public var timeout: Duration = .seconds(90)

    public init(callee: String) { self.callee = callee }
}

/// `listen`.
public struct ListenOptions: Sendable, Equatable {
    public enum Answering: String, Sendable, Equatable {
        /// Report incoming calls and let them ring.
        case report
        /// Send ringing, then answer (after `answerAfter`), probe, wait for the hang-up.
        case autoAnswer
        /// Decline at once.
        case autoReject
    }

    public var answering = Answering.report
    public var answerAfter: Duration = .zero
    /// Exit 0 after this many calls or messages (only calls with `countCallsOnly`); nil =
    /// until interrupted.
    public var count: Int?
    /// `--count-calls`: messages are reported but do not count, so messages that were
    /// pending for the device cannot end the wait for a call.
    public var countCallsOnly = false
    /// Exit 4 if `count` is not reached in time; nil = wait forever.
    public var timeout: Duration?

    public init() {}
}

/// `send RECIPIENT TEXT`.
public struct SendOptions: Sendable, Equatable {
    public enum Body: Sendable, Equatable {
        case text(String)
        /// `-`: the body is read from standard input.
        case standardInput
    }

    public var recipient: String
    public var body: Body
    public var contentType = "text/plain"
    /// A fixed id makes a retried send idempotent (the server de-duplicates by id).
    public var messageID: String?
    /// Also wait for a recipient device's delivery receipt.
    public var waitDelivered = false
    public var timeout: Duration = .seconds(30)

    public init(recipient: String, body: Body) {
        self.recipient = recipient
        self.body = body
    }
}

/// `push-register --kind KIND --token HEX`.
public struct PushRegisterOptions: Sendable, Equatable {
    public var kind: PushTokenKind
    /// Empty: unregister the kind.
    public var token: [UInt8]
    public var environment: PushEnvironment?
    public var topic: String?
    public var timeout: Duration = .seconds(30)

    public init(kind: PushTokenKind, token: [UInt8]) {
        self.kind = kind
        self.token = token
    }
}

/// What the command line asks for.
public enum VoipClientCommand: Sendable, Equatable {
    case interactive(CommonOptions)
    case call(CommonOptions, CallOptions)
    case listen(CommonOptions, ListenOptions)
    case send(CommonOptions, SendOptions)
    case pushRegister(CommonOptions, PushRegisterOptions)

    public var common: CommonOptions {
        switch self {
        case .interactive(let common), .call(let common, _), .listen(let common, _), .send(let common, _),
             .pushRegister(let common, _):
            return common
        }
    }
}

public enum Invocation: Sendable, Equatable {
    case help
    /// `--version`: print the name and version.
    case version
    case run(VoipClientCommand)
}
