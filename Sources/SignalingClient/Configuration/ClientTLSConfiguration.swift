import SignalingTLS

/// TLS on the signaling connection (docs/CLIENT.md, "TLS"): CA file or the system's store,
/// the name to check, optional pins, the lowest version. Re-exported from SignalingTLS so
/// apps need not import it.
public typealias ClientTLSConfiguration = SignalingTLS.TLSClientConfiguration
public typealias TLSVersion = SignalingTLS.TLSVersion
/// A certificate pin: SHA-256 of the SubjectPublicKeyInfo.
public typealias PublicKeyPin = SignalingTLS.PublicKeyPin

/// A client's TLS, ready for connect attempts: immutable, shared by every attempt.
struct TLSClientSetup: Sendable {
    let context: TLSClientContext
    let configuration: ClientTLSConfiguration
    let pins: [PublicKeyPin]

    /// Loads the trust store once (not per attempt). `ClientConfiguration.validate`
    /// checked the fields; a CA file that cannot be loaded is reported here.
    init(_ configuration: ClientTLSConfiguration) throws(ClientConfigurationError) {
        do {
            context = try configuration.makeContext()
        } catch {
            throw .invalid("tls: \(error.message)")
        }
        self.configuration = configuration
        pins = configuration.pins
    }

    /// The name (or address) `server`'s certificate is checked against (`ServerEndpoint.tlsName`).
    func serverName(for server: ServerEndpoint) -> String { server.tlsName(under: configuration) }
}
