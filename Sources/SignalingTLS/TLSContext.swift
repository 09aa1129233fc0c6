import COpenSSLShims

/// The TLS versions a side may be limited to (the lowest it accepts).
public enum TLSVersion: String, Sendable, CaseIterable {
    case v1_2 = "1.2"
    case v1_3 = "1.3"

    var wireValue: Int32 {
        switch self {
        case .v1_2: return VS_TLS_VERSION_1_2
        case .v1_3: return VS_TLS_VERSION_1_3
        }
    }

    init?(wireValue: Int32) {
        switch wireValue {
        case VS_TLS_VERSION_1_2: self = .v1_2
        case VS_TLS_VERSION_1_3: self = .v1_3
        default: return nil
        }
    }
}

/// Why a TLS context or connection failed, in OpenSSL's words plus ours.
public struct TLSError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    /// The peer's certificate failed verification (unknown issuer, expired, wrong name...).
    public let isCertificateRejected: Bool

    public init(_ message: String, isCertificateRejected: Bool = false) {
        self.message = message
        self.isCertificateRejected = isCertificateRejected
    }

    public var description: String { message }
}

/// The ALPN name of this protocol (docs/PROTOCOL.md): both sides offer it, a server
/// refuses a client that offers other names only.
public let signalingALPN = "vsig/1"

/// A server's TLS configuration: certificate chain, key, lowest version, ALPN, session
/// tickets. Immutable once made, so every loop thread may start connections on one context;
/// a connection holds its own reference to the context, so a reload may drop this object
/// while connections made from it live on.
public final class TLSServerContext: @unchecked Sendable {
    let raw: OpaquePointer

    /// Loads the PEM chain (leaf first) and key. `ticketKey` (80 bytes) encrypts session
    /// tickets; pass the same key to every context that should resume the others' sessions
    /// (after a reload, after a restart); nil draws a fresh one.
    public init(
        certificateChainFile: String, privateKeyFile: String, minimumVersion: TLSVersion = .v1_3,
        alpn: String? = signalingALPN, ticketKey: [UInt8]? = nil
    ) throws(TLSError) {
        var error = [CChar](repeating: 0, count: 512)
        let made = error.withUnsafeMutableBufferPointer { buffer in
            vs_tls_server_context_new(
                certificateChainFile, privateKeyFile, minimumVersion.wireValue, alpn, buffer.baseAddress, buffer.count)
        }
        guard let made else { throw TLSError(String(nulTerminated: error)) }
        if let ticketKey {
            let set = ticketKey.withUnsafeBufferPointer { vs_tls_context_set_ticket_key(made, $0.baseAddress, $0.count) }
            guard set == 1 else {
                vs_tls_context_free(made)
                throw TLSError("a session-ticket key is \(TLSServerContext.ticketKeyLength) bytes, not \(ticketKey.count)")
            }
        }
        raw = made
    }

    /// When the certificate (the chain's leaf) expires, in seconds since the Unix epoch.
    public var certificateNotAfter: Int64? {
        let expiry = vs_tls_context_certificate_expiry(raw)
        return expiry == 0 ? nil : expiry
    }

    /// The length of a session-ticket key.
    public static let ticketKeyLength = Int(VS_TLS_TICKET_KEY_LENGTH)

    deinit { vs_tls_context_free(raw) }
}

/// A client's TLS configuration: whom to trust (a CA file, or the system's store), the
/// lowest version, ALPN. Immutable once made.
public final class TLSClientContext: @unchecked Sendable {
    let raw: OpaquePointer

    /// `caFile` nil trusts the system's store (Debian: /etc/ssl/certs).
    public init(caFile: String? = nil, minimumVersion: TLSVersion = .v1_2, alpn: String? = signalingALPN) throws(TLSError) {
        var error = [CChar](repeating: 0, count: 512)
        let made = error.withUnsafeMutableBufferPointer { buffer in
            vs_tls_client_context_new(caFile, minimumVersion.wireValue, alpn, buffer.baseAddress, buffer.count)
        }
        guard let made else { throw TLSError(String(nulTerminated: error)) }
        raw = made
    }

    deinit { vs_tls_context_free(raw) }
}

extension String {
    /// The text OpenSSL wrote into a C buffer, up to its NUL.
    init(nulTerminated buffer: [CChar]) {
        self.init(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
