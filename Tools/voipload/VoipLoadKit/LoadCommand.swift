import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// The `voipload` command line: subcommands, exit statuses, where output goes.
public enum LoadCommand {
    /// Runs the command for `arguments` (without the program name); returns the exit status.
    public static func main(_ arguments: [String]) -> Int32 {
        switch arguments.first {
        case "worker":
            return WorkerMain.run()
        case "table":
            return table(Array(arguments.dropFirst()))
        case "floor":
            return floor(Array(arguments.dropFirst()))
        case "floor-relay":
            return LatencyFloor.relayMain(port: arguments.dropFirst().first.flatMap { UInt16($0) } ?? 0)
        default:
            return load(arguments)
        }
    }

    static func load(_ arguments: [String]) -> Int32 {
        if (try? LoadConfiguration.parser.parse(arguments))?.versionRequested == true {
            print(ProductVersion.line(for: "voipload"), terminator: "")
            return 0
        }
        let configuration: LoadConfiguration
        do {
            let (parsed, helpRequested) = try LoadConfiguration.parse(arguments)
            if helpRequested {
                print(LoadConfiguration.parser.helpText, terminator: "")
                return 0
            }
            configuration = parsed
        } catch {
            printError("voipload: \(error.message)\nUSAGE: \(LoadConfiguration.parser.usage)\nRun 'voipload --help' for the options.")
            return 64
        }
        do {
            let report = try Coordinator(configuration: configuration).run()
            if configuration.json {
                printError(report.summary)
                print(report.json)
            } else {
                print(report.summary, terminator: "")
            }
            return report.passed ? 0 : 1
        } catch {
            printError("voipload: \(error.message)")
            return 1
        }
    }

    static func table(_ paths: [String]) -> Int32 {
        guard !paths.isEmpty, !paths.contains(where: { $0.hasPrefix("-") }) else {
            printError("USAGE: voipload table REPORT.json...   (reports written by voipload --json)")
            return 64
        }
        var reports: [LoadReport] = []
        for path in paths {
            guard let data = FileManager.default.contents(atPath: path) else {
                printError("voipload table: cannot read \(path)")
                return 1
            }
            do {
                reports.append(try JSONDecoder().decode(LoadReport.self, from: data))
            } catch {
                printError("voipload table: \(path) is not a voipload --json report (\(error))")
                return 1
            }
        }
        print(LoadReport.table(reports), terminator: "")
        return 0
    }

    /// `voipload floor [SAMPLES]`: the machine's two-hop loopback latency floor.
    static func floor(_ arguments: [String]) -> Int32 {
        let requested: Int? = arguments.isEmpty ? 5_000 : arguments.count == 1 ? Int(arguments[0]) : nil
        guard let count = requested, (100...1_000_000).contains(count) else {
            printError("USAGE: voipload floor [SAMPLES]   (100 to 1000000, default 5000)")
            return 64
        }
        do {
            let policy = CPULatencyRequest.describeCurrentLimit()
            let hot = try LatencyFloor.measure(samples: count, gapMicroseconds: 500, receiver: .receiverJustSent)
            let idle = try LatencyFloor.measure(samples: count, gapMicroseconds: 500, receiver: .idleReceiver)
            print("two-hop loopback floor (relay process, no protocol), CPU latency limit in effect: \(policy):")
            print("  arrival at the receiving socket (one wake-up: the relay's):")
            print("    receiver idle between stamps, as a benchmark device: " + latencyLine(LoadReport.Latency(idle.arrival)))
            print("  read by the receiver (two wake-ups):")
            print("    receiver idle between stamps, as a benchmark device: " + latencyLine(LoadReport.Latency(idle.read)))
            print("    receiver is the sender, just asleep (best case):     " + latencyLine(LoadReport.Latency(hot.read)))
            // What the host would gain from `voipserver --cpu-latency-limit 0` (idle CPUs
            // poll instead of halting), where this process may ask for it.
            if CPULatencyRequest.currentLimit() != 0, let request = try? CPULatencyRequest(microseconds: 0) {
                let polled = try LatencyFloor.measure(samples: count, gapMicroseconds: 500, receiver: .idleReceiver)
                withExtendedLifetime(request) {}
                print("  CPU latency limit 0 (idle CPUs poll), receiver idle:")
                print("    arrival: " + latencyLine(LoadReport.Latency(polled.arrival)))
                print("    read:    " + latencyLine(LoadReport.Latency(polled.read)))
            }
            return 0
        } catch {
            printError("voipload floor: \(error.message)")
            return 1
        }
    }

    static func printError(_ text: String) {
        var bytes = Array((text.hasSuffix("\n") ? text : text + "\n").utf8)
        _ = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
    }
}
