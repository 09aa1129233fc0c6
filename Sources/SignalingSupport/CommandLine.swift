/// One `--name [VALUE]` option of a command.
public struct OptionSpec: Sendable {
    public var name: String
    /// Nil for a flag (no value); otherwise how the value is shown in help, e.g. "HOST:PORT".
    public var valueName: String?
    public var help: String
    /// Shown as "(default: ...)" in help.
    public var defaultValue: String?
    /// May be given several times (values accumulate).
    public var repeatable: Bool

    public init(_ name: String, value: String? = nil, default defaultValue: String? = nil, repeatable: Bool = false, help: String) {
        self.name = name
        self.valueName = value
        self.help = help
        self.defaultValue = defaultValue
        self.repeatable = repeatable
    }

    public var isFlag: Bool { valueName == nil }
}

/// A command-line mistake: printed with the usage line, exit status 64 (EX_USAGE).
public struct UsageError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// What the user gave.
public struct ParsedOptions: Sendable {
    public var values: [String: [String]] = [:]
    public var positionals: [String] = []
    public var helpRequested = false
    /// `--version` was given (anywhere): print `ProductVersion.line(for:)` and exit 0.
    public var versionRequested = false

    public init() {}

    public func has(_ name: String) -> Bool { values[name] != nil }
    public func flag(_ name: String) -> Bool { values[name] != nil }
    public func string(_ name: String) -> String? { values[name]?.last }
    public func all(_ name: String) -> [String] { values[name] ?? [] }

    public func int(_ name: String, in range: ClosedRange<Int>? = nil) throws(UsageError) -> Int? {
        guard let text = string(name) else { return nil }
        guard let value = Int(text) else { throw UsageError("--\(name) expects a whole number, got '\(text)'") }
        if let range, !range.contains(value) {
            throw UsageError("--\(name) must be between \(range.lowerBound) and \(range.upperBound), got \(value)")
        }
        return value
    }

    public func double(_ name: String, in range: ClosedRange<Double>? = nil) throws(UsageError) -> Double? {
        guard let text = string(name) else { return nil }
        guard let value = Double(text), value.isFinite else { throw UsageError("--\(name) expects a number, got '\(text)'") }
        if let range, !range.contains(value) {
            throw UsageError("--\(name) must be between \(range.lowerBound) and \(range.upperBound), got \(text)")
        }
        return value
    }
}

/// A small, strict GNU-style parser: `--name value`, `--name=value`, flags, `--` ends
/// options, `-h`/`--help` anywhere. Unknown options are errors, never ignored.
public struct CommandLineParser: Sendable {
    public var command: String
    public var usage: String
    public var summary: String
    public var options: [OptionSpec]
    /// Free text appended to --help (subcommands, exit codes, examples).
    public var epilogue: String

    public init(command: String, usage: String, summary: String, options: [OptionSpec], epilogue: String = "") {
        self.command = command
        self.usage = usage
        self.summary = summary
        self.options = options
        self.epilogue = epilogue
    }

    public func parse(_ arguments: [String]) throws(UsageError) -> ParsedOptions {
        var parsed = ParsedOptions()
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if optionsEnded || !argument.hasPrefix("-") || argument == "-" {
                parsed.positionals.append(argument)
                continue
            }
            if argument == "--" { optionsEnded = true; continue }
            if argument == "-h" || argument == "--help" { parsed.helpRequested = true; continue }
            if argument == "--version" && !options.contains(where: { $0.name == "version" }) {
                parsed.versionRequested = true
                continue
            }
            guard argument.hasPrefix("--") else { throw UsageError("unknown option '\(argument)'") }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            guard let spec = options.first(where: { $0.name == name }) else {
                throw UsageError("unknown option '--\(name)'")
            }
            let value: String
            if spec.isFlag {
                if inlineValue != nil { throw UsageError("--\(name) takes no value") }
                value = "true"
            } else if let inlineValue {
                value = inlineValue
            } else {
                guard index < arguments.count else { throw UsageError("--\(name) needs a value (\(spec.valueName!))") }
                value = arguments[index]
                index += 1
            }
            if parsed.values[name] != nil && !spec.repeatable && !spec.isFlag {
                throw UsageError("--\(name) given more than once")
            }
            parsed.values[name, default: []].append(value)
        }
        return parsed
    }

    public var helpText: String {
        var text = "USAGE: \(usage)\n\n\(summary)\n\nOPTIONS:\n"
        let labels = options.map { "--\($0.name)" + ($0.valueName.map { " \($0)" } ?? "") }
        let width = min(30, (labels.map(\.count).max() ?? 0) + 2)
        for (spec, label) in zip(options, labels) {
            var help = spec.help
            if let defaultValue = spec.defaultValue { help += " (default: \(defaultValue))" }
            let padding = label.count < width ? String(repeating: " ", count: width - label.count) : "\n" + String(repeating: " ", count: width + 2)
            text += "  \(label)\(padding)\(help)\n"
        }
        text += "  -h, --help" + String(repeating: " ", count: max(1, width - 10)) + "Show this help.\n"
        text += "  --version" + String(repeating: " ", count: max(1, width - 9)) + "Print the name and version, and exit.\n"
        if !epilogue.isEmpty { text += "\n" + epilogue + (epilogue.hasSuffix("\n") ? "" : "\n") }
        return text
    }
}

/// What a subcommand run (`voipserver token`, `voipserver store-rebalance`) prints and
/// returns: the executable writes the two texts and exits with `status`.
public struct CommandOutcome: Equatable, Sendable {
    public var output = ""
    public var error = ""
    public var status: Int32 = 0

    public init(output: String = "", error: String = "", status: Int32 = 0) {
        self.output = output
        self.error = error
        self.status = status
    }
}
