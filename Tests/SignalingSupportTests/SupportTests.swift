import Testing
@testable import SignalingSupport

@Suite("Support utilities")
struct SupportTests {
    let parser = CommandLineParser(
        command: "tool", usage: "tool [options] ARG", summary: "A tool.",
        options: [
            OptionSpec("name", value: "NAME", default: "x", help: "A name."),
            OptionSpec("verbose", help: "Talk more."),
            OptionSpec("tag", value: "T", repeatable: true, help: "Tags."),
        ])

    @Test("backslash escaping: a value with nothing to escape comes back as it is; backslash, quote and line feed are escaped")
    func backslashEscaping() {
        #expect(TextEscaping.backslashEscaped("vs-loop-0 éé") == "vs-loop-0 éé")
        #expect(TextEscaping.backslashEscaped("a\\b\"c\nd") == "a\\\\b\\\"c\\nd")
        #expect(TextEscaping.backslashEscaped("") == "")
    }

    @Test("options, flags, repeats, = syntax, -- and positionals")
    func parses() throws {
        let parsed = try parser.parse(["a", "--name", "n1", "--verbose", "--tag=t1", "--tag", "t2", "--", "--not-an-option"])
        #expect(parsed.string("name") == "n1")
        #expect(parsed.flag("verbose"))
        #expect(parsed.all("tag") == ["t1", "t2"])
        #expect(parsed.positionals == ["a", "--not-an-option"])
        #expect(!parsed.helpRequested)
        #expect(try parser.parse(["-h"]).helpRequested)
    }

    @Test("mistakes are errors, never ignored", arguments: [
        (["--nope"], "unknown option '--nope'"),
        (["--name"], "--name needs a value (NAME)"),
        (["--verbose=yes"], "--verbose takes no value"),
        (["--name", "a", "--name", "b"], "--name given more than once"),
        (["-x"], "unknown option '-x'"),
    ])
    func mistakes(arguments: [String], message: String) {
        #expect(throws: UsageError(message)) { try parser.parse(arguments) }
    }

    @Test("numbers are checked against their range")
    func numbers() throws {
        var parsed = ParsedOptions()
        parsed.values["n"] = ["12"]
        #expect(try parsed.int("n", in: 1...20) == 12)
        #expect(throws: UsageError("--n must be between 1 and 10, got 12")) { try parsed.int("n", in: 1...10) }
        parsed.values["n"] = ["1.5x"]
        #expect(throws: UsageError("--n expects a number, got '1.5x'")) { try parsed.double("n") }
    }

    @Test("help lists every option with its default")
    func help() {
        let text = parser.helpText
        #expect(text.contains("USAGE: tool [options] ARG"))
        #expect(text.contains("--name NAME") && text.contains("(default: x)"))
        #expect(text.contains("--verbose") && text.contains("-h, --help"))
    }

    @Test("log values with spaces, quotes or newlines are quoted and escaped")
    func logQuoting() {
        #expect(Logger.quoted("plain") == "plain")
        #expect(Logger.quoted("") == "\"\"")
        #expect(Logger.quoted("two words") == "\"two words\"")
        #expect(Logger.quoted("a=\"b\"\n") == "\"a=\\\"b\\\"\\n\"")
        #expect(Logger.timestamp(1_800_000_000_123) == "2027-01-15T08:00:00.123Z")
    }

    @Test("the manual clock moves both timelines, and only when told")
    func manualClock() {
        let clock = ManualClock()
        let start = clock.now()
        let wall = clock.wallMilliseconds()
        #expect(clock.now() == start)
        clock.advance(by: .seconds(600))
        #expect(clock.now() - start == .seconds(600))
        #expect(clock.wallMilliseconds() == wall + 600_000)
    }

    @Test("integer instant arithmetic agrees with Duration's: whole seconds rounded down, never negative")
    func integerInstantArithmetic() {
        let start = Instant(nanoseconds: 5_000_000_000)
        for duration: Duration in [.zero, .nanoseconds(1), .milliseconds(1_500), .seconds(86_400), .seconds(30 * 86_400)] {
            #expect(start.adding(nanoseconds: duration.wholeNanoseconds) == start + duration)
            let later = start + duration
            #expect(later.wholeSeconds(since: start) == UInt64((later - start).seconds))
        }
        #expect(Duration.milliseconds(-5).wholeNanoseconds == 0)
        #expect(Duration.seconds(Int64.max).wholeNanoseconds == .max)
        #expect(start.adding(nanoseconds: .max) == Instant(nanoseconds: .max))
        #expect(start.wholeSeconds(since: Instant(nanoseconds: 7_000_000_000)) == 0)
        #expect(Instant(nanoseconds: 3_999_999_999).wholeSeconds(since: Instant(nanoseconds: 1_000_000_000)) == 2)
    }

    @Test("CPU lists: numbers and ranges in order, mistakes refused")
    func cpuLists() throws {
        #expect(try CPUList.parse("3") == [3])
        #expect(try CPUList.parse("0-3,6") == [0, 1, 2, 3, 6])
        #expect(try CPUList.parse("5,1,1") == [5, 1, 1], "order and repeats are the caller's")
        #expect(try CPUList.parse("1023") == [1023])
        for bad in ["", ",", "1,", "a", "-1", "1-", "3-1", "1024", "0-1024", "1.5", "+2", "1--2", " 1"] {
            #expect(throws: UsageError.self, "'\(bad)'") { try CPUList.parse(bad) }
        }
        #expect(CPUList.configuredCount >= 1)
    }

    @Test("the fast generator is deterministic for a seed and varies between seeds")
    func fastRandom() {
        var a = FastRandom(seed: (1, 2, 3, 4))
        var b = FastRandom(seed: (1, 2, 3, 4))
        let first = (0..<8).map { _ in a.next() }
        #expect(first == (0..<8).map { _ in b.next() })
        #expect(Set(first).count == 8)
        var zero = FastRandom(seed: (0, 0, 0, 0))
        #expect(zero.next() != 0 || zero.next() != 0)
        var seeded = FastRandom()
        var other = FastRandom()
        #expect(seeded.next() != other.next())
    }
}
