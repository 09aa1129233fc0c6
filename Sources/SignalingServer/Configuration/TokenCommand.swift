import SignalingCrypto
import SignalingSupport

/// `voipserver token`: mints one device token (docs/AUTH.md) for operators, tests and app
/// backends. The executable only passes its arguments and prints the result.
public enum TokenCommand {
    public static let parser = CommandLineParser(
        command: "voipserver token",
        usage: "voipserver token --user U [--device D] [--ttl 24h] --key-file FILE [--kid K]",
        summary: """
            Print a signed device token (docs/AUTH.md) that a server run with --auth-key-file FILE accepts \
            until it expires.
            """,
        options: [
            OptionSpec("user", value: "U", help: "The user id the token is for."),
            OptionSpec("device", value: "D", help: "The device id the token is for. (default: any device of the user)"),
            OptionSpec("ttl", value: "DURATION", default: "24h", help: "How long the token is accepted: N, Ns, Nm, Nh or Nd."),
            OptionSpec("key-file", value: "FILE", help: "The server's key file: lines 'KID SECRET'."),
            OptionSpec("kid", value: "K", help: "Sign with this key of FILE. (default: the last key in FILE, the newest)"),
        ],
        epilogue: """
            EXIT STATUS:
              0 with the token on standard output, 64 for a usage error.
            """)

    public typealias Outcome = CommandOutcome

    /// Runs the command with `arguments` (those after `token`) at Unix time `now`.
    public static func run(_ arguments: [String], now: Int64) -> Outcome {
        do {
            let options = try parser.parse(arguments)
            if options.helpRequested { return Outcome(output: parser.helpText) }
            if options.versionRequested { return Outcome(output: ProductVersion.line(for: "voipserver")) }
            return Outcome(output: try mint(options, now: now) + "\n")
        } catch {
            return Outcome(error: "voipserver token: \(error.message)\nTry 'voipserver token --help'.\n", status: 64)
        }
    }

    static func mint(_ options: ParsedOptions, now: Int64) throws(UsageError) -> String {
        guard options.positionals.isEmpty else { throw UsageError("unexpected argument '\(options.positionals[0])'") }
        guard let user = options.string("user") else { throw UsageError("--user is required") }
        guard let path = options.string("key-file") else { throw UsageError("--key-file is required") }
        let ttl = try parseDuration(options.string("ttl") ?? "24h")
        let keys = try ServerOptions.readKeyFile(path, option: "key-file")
        let key: TokenKey
        if let kid = options.string("kid") {
            guard let named = keys.first(where: { $0.id == kid }) else {
                throw UsageError("--kid: \(path) has no key '\(kid)' (it has \(keys.map(\.id).joined(separator: ", ")))")
            }
            key = named
        } else {
            key = keys[keys.count - 1]
        }
        let (expiresAt, overflow) = now.addingReportingOverflow(ttl)
        guard !overflow else { throw UsageError("--ttl is too long") }
        do {
            return try DeviceToken.mint(
                DeviceTokenClaims(userID: user, deviceID: options.string("device"), expiresAt: expiresAt), key: key)
        } catch {
            throw UsageError(error.message)
        }
    }

    /// Seconds in `N`, `Ns`, `Nm`, `Nh` or `Nd` (N a positive whole number).
    public static func parseDuration(_ text: String) throws(UsageError) -> Int64 {
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        var digits = Substring(text)
        var unit: Int64 = 1
        if let last = digits.last, let multiplier = units[last] {
            unit = multiplier
            digits = digits.dropLast()
        }
        guard let count = Int64(digits), count > 0, !digits.hasPrefix("+") else {
            throw UsageError("--ttl expects N, Ns, Nm, Nh or Nd with N > 0, got '\(text)'")
        }
        let (seconds, overflow) = count.multipliedReportingOverflow(by: unit)
        guard !overflow else { throw UsageError("--ttl is too long") }
        return seconds
    }
}
