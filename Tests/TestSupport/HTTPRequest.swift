import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A minimal HTTP/1.1 client for tests: one request per connection (`Connection: close`)
/// over a real loopback socket, the whole response read until the server closes, within a
/// deadline.
public struct HTTPReply: Sendable {
    public var status: Int
    /// Header names lower-cased.
    public var headers: [String: String]
    public var body: [UInt8]

    public var text: String { String(decoding: body, as: UTF8.self) }

    /// The body as a JSON object (nil if it is not one).
    public var json: [String: Any]? { (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] }
}

public struct HTTPRequestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(description: String) { self.description = description }
}

public enum HTTPRequest {
    public static func send(
        _ method: String, port: UInt16, _ path: String, body: [UInt8]? = nil, headers: [String: String] = [:],
        host: String = "127.0.0.1", timeout: Duration = .seconds(10)
    ) throws -> HTTPReply {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HTTPRequestFailure(description: "socket: \(errno)") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, host, &address.sin_addr)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw HTTPRequestFailure(description: "connect to \(host):\(port): \(String(cString: strerror(errno)))") }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        var request = Array(head.utf8) + (body ?? [])
        var offset = 0
        while offset < request.count {
            // MSG_NOSIGNAL: a server that answers and closes before reading everything (a
            // refused token, a body too large) must not kill the test process with SIGPIPE.
            let written = request.withUnsafeMutableBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw HTTPRequestFailure(description: "write: \(errno)") }
            offset += written
        }
        var response: [UInt8] = []
        let deadline = SystemClock().now() + timeout
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let left = deadline - SystemClock().now()
            guard left > .zero else { throw HTTPRequestFailure(description: "no complete response within \(timeout)") }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, Int32(max(1, left.milliseconds))) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            response += buffer[..<count]
        }
        return try parse(response)
    }

    /// Splits a whole response (the body is what follows the headers: `Connection: close`).
    public static func parse(_ response: [UInt8]) throws -> HTTPReply {
        guard let end = response.indices.first(where: { response[$0...].starts(with: [13, 10, 13, 10]) }) else {
            throw HTTPRequestFailure(description: "no header end in \(String(decoding: response, as: UTF8.self))")
        }
        let lines = String(decoding: response[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let statusParts = lines[0].split(separator: " ")
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else {
            throw HTTPRequestFailure(description: "bad status line \(lines[0])")
        }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return HTTPReply(status: status, headers: headers, body: Array(response[(end + 4)...]))
    }
}
