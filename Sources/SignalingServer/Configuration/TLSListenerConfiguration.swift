import SignalingCrypto
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// The TLS device listener (`--tls-listen`, docs/OPERATIONS.md "TLS"): a second listening
/// socket per loop, beside the plain one or instead of it, whose connections speak TLS
/// (ALPN `vsig/1`) before the protocol's first frame.
public struct TLSListenerConfiguration: Sendable, Equatable {
    /// Address and port (0 picks a free one: tests).
    public var host: String
    public var port: UInt16
    /// The certificate chain (PEM, leaf first) and its private key. Read again on SIGHUP.
    public var certificateChainFile: String
    public var privateKeyFile: String
    /// The lowest version accepted. TLS 1.3 unless old devices need 1.2.
    public var minimumVersion: TLSVersion = .v1_3
    /// Where the session-ticket key comes from.
    public var ticketKey: TicketKeySource = .perProcess
    /// Every connection starts with a PROXY protocol v2 header from a TCP load balancer
    /// in front, before the TLS handshake (`--tls-proxy-protocol`).
    public var proxyProtocol = false

    public init(host: String, port: UInt16, certificateChainFile: String, privateKeyFile: String) {
        self.host = host
        self.port = port
        self.certificateChainFile = certificateChainFile
        self.privateKeyFile = privateKeyFile
    }
}

/// The key that encrypts session tickets. Every context built with the same key accepts
/// the others' tickets: a device that reconnects after a certificate reload or, with a
/// key on disk, after a restart resumes its session (one signature less for the server,
/// one round trip of key exchange less for both).
public enum TicketKeySource: Sendable, Equatable {
    /// An operator's file (`--tls-ticket-key-file`): 160 hex digits (`openssl rand -hex
    /// 80`), read at start and on SIGHUP. Shared by several servers behind one balancer,
    /// it lets each resume the others' sessions.
    case file(String)
    /// A file in the data directory, made (mode 0600) on the first start: the reconnect
    /// storm after a restart resumes.
    case dataDirectory(String)
    /// A random key drawn at start (no data directory): kept across reloads, lost with
    /// the process.
    case perProcess

    /// The file name of the key in the data directory.
    public static let fileName = "tls-ticket-key"

    /// The key this source names, making the data directory's file when it does not exist
    /// yet. `drawn` is this process's random key (for `.perProcess`).
    func load(drawn: [UInt8]) throws(ServerError) -> [UInt8] {
        switch self {
        case .perProcess:
            return drawn
        case .file(let path):
            return try Self.read(path, option: "--tls-ticket-key-file")
        case .dataDirectory(let path):
            if access(path, F_OK) != 0 { try Self.create(path) }
            return try Self.read(path, option: "the data directory's \(Self.fileName)")
        }
    }

    private static func read(_ path: String, option: String) throws(ServerError) -> [UInt8] {
        guard let text = readTextFile(path) else { throw ServerError("\(option): cannot read \(path)") }
        let digits = text.split(whereSeparator: \.isWhitespace).joined()
        guard let key = Hex.decode(digits), key.count == TLSServerContext.ticketKeyLength else {
            throw ServerError(
                "\(option): \(path) must hold \(TLSServerContext.ticketKeyLength * 2) hex digits (openssl rand -hex \(TLSServerContext.ticketKeyLength))")
        }
        return key
    }

    /// Writes a fresh random key, readable by the owner only, without ever replacing a
    /// file (O_EXCL: two servers sharing a directory agree on the first one's key).
    private static func create(_ path: String) throws(ServerError) {
        let key: [UInt8]
        do {
            key = try SecureRandom.bytes(TLSServerContext.ticketKeyLength)
        } catch {
            throw ServerError("cannot draw a session-ticket key: \(error)")
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if fd < 0 && errno == EEXIST { return }
        guard fd >= 0 else { throw ServerError("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let text = Array((Hex.encode(key) + "\n").utf8)
        let written = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written == text.count, fsync(fd) == 0 else {
            unlink(path)
            throw ServerError("cannot write \(path): \(String(cString: strerror(errno)))")
        }
    }
}

/// Hexadecimal text, for keys in files.
enum Hex {
    static func encode(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Nil unless `text` is an even number of hex digits (either case).
    static func decode(_ text: String) -> [UInt8]? {
        let characters = Array(text.utf8)
        guard characters.count % 2 == 0 else { return nil }
        func value(_ character: UInt8) -> UInt8? {
            switch character {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return character - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return character - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return character - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(characters.count / 2)
        var index = 0
        while index < characters.count {
            guard let high = value(characters[index]), let low = value(characters[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }
}
