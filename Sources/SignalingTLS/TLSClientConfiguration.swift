import SignalingSupport

/// What a client is told about TLS: whom to trust, which name the certificate must carry,
/// which public keys to pin, the lowest version. The client library, voipclient and
/// voipload take the same configuration, from code or from the same command-line options.
///
/// The server's chain must verify against `caFile` (or the system's store) and name
/// `serverName`; with pins, the certificate's public key must also match one of them.
public struct TLSClientConfiguration: Sendable, Equatable, Codable {
    /// PEM file of the certificate authorities to trust; nil trusts the system's store
    /// (Debian: /etc/ssl/certs).
    public var caFile: String?
    /// The name the certificate must carry, also sent as SNI; an IP address literal is
    /// checked against the certificate's IP entries. nil: the host dialled.
    public var serverName: String?
    /// Any of these must match the server certificate's public key, in addition to the
    /// chain check. Pin the current key and the next one, so a key rotation needs no
    /// client update. Empty: no pin.
    public var pins: [PublicKeyPin]
    /// The lowest version accepted. 1.2 by default so a TLS-terminating load balancer that
    /// speaks only 1.2 still works; voipserver itself negotiates 1.3.
    public var minimumVersion: TLSVersion

    public init(caFile: String? = nil, serverName: String? = nil, pins: [PublicKeyPin] = [], minimumVersion: TLSVersion = .v1_2) {
        self.caFile = caFile
        self.serverName = serverName
        self.pins = pins
        self.minimumVersion = minimumVersion
    }

    /// The context to start connections with: loads the trust store (once, not per
    /// connection: it is the expensive part).
    public func makeContext() throws(TLSError) -> TLSClientContext {
        try TLSClientContext(caFile: caFile, minimumVersion: minimumVersion)
    }

    /// The name a connection to `host` checks.
    public func checkedName(dialling host: String) -> String { serverName ?? host }

    // MARK: Command line

    /// `--tls`, `--ca-file`, `--server-name`, `--pin` (repeatable): the options of every
    /// client tool. Any of the last three implies `--tls`, as in mosquitto_pub.
    public static let commandLineOptions: [OptionSpec] = [
        OptionSpec("tls", help: "Speak TLS to the server (implied by --ca-file, --server-name and --pin)."),
        OptionSpec("ca-file", value: "FILE", default: "the system's CA store", help: "PEM file of the certificate authorities to trust."),
        OptionSpec("server-name", value: "NAME", default: "the host of --server", help: "Name the server's certificate must carry (also sent as SNI); an IP address is checked against the certificate's IP entries."),
        OptionSpec("pin", value: "SHA256HEX", repeatable: true, help: "SHA-256 of the server certificate's public key (64 hex digits); repeat to allow the next key too. Get it with: openssl x509 -in CERT -pubkey -noout | openssl pkey -pubin -outform der | sha256sum"),
    ]

    public static let commandLineNames: Set<String> = Set(commandLineOptions.map(\.name))

    /// The configuration the options describe; nil when none of them was given (plain TCP).
    public static func parse(_ parsed: ParsedOptions) throws(UsageError) -> TLSClientConfiguration? {
        guard commandLineNames.contains(where: parsed.has) else { return nil }
        var configuration = TLSClientConfiguration()
        if let file = parsed.string("ca-file") {
            guard !file.isEmpty else { throw UsageError("--ca-file must not be empty") }
            configuration.caFile = file
        }
        if let name = parsed.string("server-name") {
            guard !name.isEmpty, !name.contains(where: { $0.isWhitespace || $0 == "/" }) else {
                throw UsageError("--server-name expects a host name or an address, got '\(name)'")
            }
            configuration.serverName = name
        }
        for text in parsed.all("pin") {
            guard let pin = PublicKeyPin(hex: text) else {
                throw UsageError("--pin expects the 64 hex digits of a SHA-256, got '\(text)'")
            }
            configuration.pins.append(pin)
        }
        return configuration
    }
}

extension TLSVersion: Codable {}
