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
        guard let server = SocketCalls.parseEndpoint("\(host):\(port)") else { throw HTTPRequestFailure(description: "bad host \(host)") }
        let fd = try SocketCalls.openTCP(nonBlocking: false)
        defer { close(fd) }
        do {
            _ = try SocketCalls.connect(fd, SocketCalls.socketAddress(server.address, port: server.port))
        } catch {
            throw HTTPRequestFailure(description: "connect to \(host):\(port): \(error.reason)")
        }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        let request = Array(head.utf8) + (body ?? [])
        // Never SIGPIPE (SocketCalls.send): a server that answers and closes before reading
        // everything (a refused token, a body too large) must not kill the test process.
        try request.withUnsafeBytes { bytes in Result { () throws(SystemError) in try SocketCalls.sendAll(fd, bytes) } }.get()
        var response: [UInt8] = []
        let deadline = SystemClock().now() + timeout
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let left = deadline - SystemClock().now()
            guard left > .zero else { throw HTTPRequestFailure(description: "no complete response within \(timeout)") }
            guard SocketCalls.wait(fd, for: Int16(POLLIN), milliseconds: Int32(max(1, left.milliseconds))) else { continue }
            guard case .transferred(let count) = buffer.withUnsafeMutableBytes({ SocketCalls.receive(fd, into: $0) }), count > 0 else { break }
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
