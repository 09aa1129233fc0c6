/// Fixed limits of protocol version 1. Servers may enforce a smaller maximum frame size
/// (announced in WELCOME) but never larger field limits than these.
public enum ProtocolLimits {
    /// The protocol version this codec speaks.
    public static let version: UInt16 = 1
    /// The four bytes that open every HELLO body, so a server can tell a stray HTTP
    /// request or a port scanner from a client at once.
    public static let helloMagic: [UInt8] = Array("VSIG".utf8)
    /// Bytes of the length prefix.
    public static let lengthPrefixSize = 4
    /// Longest user, device, call or message id, in UTF-8 bytes.
    public static let maxIdentifierBytes = 128
    /// Longest content type, push platform name or human-readable message, in UTF-8 bytes.
    public static let maxShortTextBytes = 256
    /// Longest credential or push token, in bytes.
    public static let maxTokenBytes = 4096
    /// Longest push environment name (PUSH_REGISTER `environment`), in UTF-8 bytes.
    public static let maxPushEnvironmentBytes = 32
    /// The smallest keep-alive interval a server may hand out or a client may request.
    public static let minimumKeepAliveSeconds: UInt32 = 600
    /// The default maximum frame size (type byte plus body), 64 KiB.
    public static let defaultMaxFrameLength = 64 * 1024
}
