#if canImport(Glibc)
import Glibc
#endif

/// The offer and answer blobs voipclient puts in CALL_INVITE and CALL_ACCEPT: a small,
/// SDP-like text (the server never reads it) that says where the probe socket listens.
///
///     v=0
///     o=voipclient alice phone
///     c=IN IP4 127.0.0.1
///     m=probe 40312 udp vcprobe/1
///
/// Lines end with CRLF (LF alone is accepted). Parsing needs `c=` and `m=probe`; other
/// lines are ignored, so an app that appends its own lines (or real SDP with an extra
/// `m=probe` line) still interoperates.
public struct MediaDescription: Sendable, Equatable {
    public var endpoint: UDPEndpoint
    /// `o=` line: who made it (informational).
    public var origin: String

    public init(endpoint: UDPEndpoint, origin: String) {
        self.endpoint = endpoint
        self.origin = origin
    }

    public var text: String {
        let family = endpoint.family == AF_INET6 ? "IP6" : "IP4"
        return "v=0\r\no=\(origin)\r\nc=IN \(family) \(endpoint.host)\r\nm=probe \(endpoint.port) udp vcprobe/1\r\n"
    }

    public var bytes: [UInt8] { Array(text.utf8) }

    public enum ParseError: Error, Equatable, CustomStringConvertible {
        case notText
        case missingConnectionLine
        case missingProbeLine
        case badAddress(String)
        case badPort(String)

        public var description: String {
            switch self {
            case .notText: return "the description is not UTF-8 text"
            case .missingConnectionLine: return "no 'c=IN IP4|IP6 ADDRESS' line"
            case .missingProbeLine: return "no 'm=probe PORT' line"
            case .badAddress(let text): return "bad address '\(text)'"
            case .badPort(let text): return "bad port '\(text)'"
            }
        }
    }

    public static func parse(_ bytes: [UInt8]) -> Result<MediaDescription, ParseError> {
        guard let text = String(validating: bytes, as: UTF8.self) else { return .failure(.notText) }
        var address: String?
        var port: UInt16?
        var origin = ""
        // "\r\n" is one Character in Swift, so this splits CRLF, LF and CR lines alike.
        for line in text.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }) {
            if line.hasPrefix("o=") {
                origin = String(line.dropFirst(2))
            } else if line.hasPrefix("c=") {
                let fields = line.dropFirst(2).split(separator: " ")
                guard fields.count >= 3, fields[0] == "IN", fields[1] == "IP4" || fields[1] == "IP6" else {
                    return .failure(.badAddress(String(line)))
                }
                address = String(fields[2])
            } else if line.hasPrefix("m=probe ") {
                let fields = line.dropFirst(2).split(separator: " ")
                guard fields.count >= 2, let value = UInt16(fields[1]), value != 0 else {
                    return .failure(.badPort(String(line)))
                }
                port = value
            }
        }
        guard let address else { return .failure(.missingConnectionLine) }
        guard let port else { return .failure(.missingProbeLine) }
        guard let endpoint = UDPEndpoint(host: address, port: port) else { return .failure(.badAddress(address)) }
        return .success(MediaDescription(endpoint: endpoint, origin: origin))
    }
}
