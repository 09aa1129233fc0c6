/// An IPv4 server address and port (host byte order), as the workers dial it.
public struct LoopbackEndpoint: Codable, Sendable, Equatable {
    public var address: UInt32
    public var port: UInt16

    public init(_ endpoint: (address: UInt32, port: UInt16)) {
        address = endpoint.address
        port = endpoint.port
    }
}
