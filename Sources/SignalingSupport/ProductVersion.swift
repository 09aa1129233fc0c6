/// The version of this source tree, the same for every executable built from it (the
/// server, the client tools, the load tool): `--version` prints it, and the server's
/// `listening` log line carries it, so a log says which build produced it. Raise it with
/// every release; the wire protocol has its own version (`ProtocolLimits.version`).
public enum ProductVersion {
    public static let current = "1.4.0"

    /// What `--version` prints: `voipserver 1.4.0`.
    public static func line(for command: String) -> String {
        "\(command) \(current)\n"
    }
}
