/// A decoding failure: the bytes received break the protocol. The server answers with a
/// CLOSE frame carrying `code` and `message`, then closes the connection.
public struct ProtocolViolation: Error, Equatable, Sendable, CustomStringConvertible {
    public var code: CloseCode
    public var message: String

    public init(_ code: CloseCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code) (\(code.rawValue)): \(message)" }
}
