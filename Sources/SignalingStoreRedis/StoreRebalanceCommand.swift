import SignalingStore
import SignalingSupport

/// `voipserver store-rebalance`: moves a Redis store's users onto a new list of instances
/// (`RedisRebalance`, docs/STORAGE.md "Adding an instance"). The executable only passes
/// its arguments and prints the result.
public enum StoreRebalanceCommand {
    public static let parser = CommandLineParser(
        command: "voipserver store-rebalance",
        usage: "voipserver store-rebalance --from redis://A[,redis://B...] --to redis://A[,redis://B...] [--dry-run] [--force]",
        summary: """
            Move every user of a Redis store to the instance the new list places it on, so that voipserver can \
            start with --store/--cluster set to the new list. Stop every voipserver of the store first: the \
            move fences the store, and nodes refuse it until the move is finished. An interrupted move \
            (exit status 70) is finished by running the same command again.
            """,
        options: [
            OptionSpec("from", value: "URLS", help: "The store's instances now, in order: the list the nodes ran with."),
            OptionSpec("to", value: "URLS", help: "The new list (for example the old one with an instance added at the end)."),
            OptionSpec("dry-run", help: "Count the users that would move and where users would be; change nothing."),
            OptionSpec("force", help: "Move even though a node holds the lease or announces itself (only when that node is known to be dead)."),
            OptionSpec("redis-fsync", value: "always|everysec", default: "always",
                       help: "The weakest AOF setting accepted on every instance, as for voipserver."),
            OptionSpec("redis-allow-volatile", help: "Accept instances whose AOF is weaker than --redis-fsync (a warning instead)."),
        ],
        epilogue: """
            EXIT STATUS:
              0 when every user is in place, 64 for a usage error, 70 when the move was refused or failed \
            (run it again to finish it).
            """)

    public typealias Outcome = CommandOutcome

    /// Runs the command with `arguments` (those after `store-rebalance`).
    public static func run(_ arguments: [String], logger: Logger = .silent) -> Outcome {
        let options: RedisRebalance.Options
        do {
            let parsed = try parser.parse(arguments)
            if parsed.helpRequested { return Outcome(output: parser.helpText) }
            if parsed.versionRequested { return Outcome(output: ProductVersion.line(for: "voipserver")) }
            options = try rebalanceOptions(parsed)
        } catch {
            return Outcome(error: "voipserver store-rebalance: \(error.message)\nTry 'voipserver store-rebalance --help'.\n", status: 64)
        }
        do {
            let report = try RedisRebalance.run(options, logger: logger)
            let verb = options.dryRun ? "would move" : "moved"
            return Outcome(output: """
                \(verb) \(report.usersMoved) users (\(report.keysMoved) keys); \(report.usersInPlace) users stay where they are\
                \(report.resumed ? "; finished an interrupted move" : "")
                users per instance: \(zip(options.to, report.usersPerInstance).map { "\($0.redacted) \($1)" }.joined(separator: ", "))

                """)
        } catch {
            return Outcome(error: "voipserver store-rebalance: \(error.message)\n", status: 70)
        }
    }

    static func rebalanceOptions(_ parsed: ParsedOptions) throws(UsageError) -> RedisRebalance.Options {
        guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument '\(parsed.positionals[0])'") }
        func list(_ name: String) throws(UsageError) -> [RedisEndpoint] {
            guard let text = parsed.string(name) else { throw UsageError("--\(name) is required") }
            do {
                return try RedisEndpoint.list(text)
            } catch {
                throw UsageError("--\(name): \(error.message)")
            }
        }
        var options = RedisRebalance.Options(from: try list("from"), to: try list("to"))
        options.force = parsed.flag("force")
        options.dryRun = parsed.flag("dry-run")
        options.allowVolatile = parsed.flag("redis-allow-volatile")
        let fsync = parsed.string("redis-fsync") ?? "always"
        guard let required = RedisStoreConfiguration.Fsync(rawValue: fsync) else {
            throw UsageError("--redis-fsync is always or everysec, got '\(fsync)'")
        }
        options.requiredFsync = required
        return options
    }
}
