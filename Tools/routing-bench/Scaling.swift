import Foundation
import SignalingServer

/// `routing-bench scaling` (see main.swift).
func runScaling(_ arguments: [String]) {
    var options = ["--threads": "1 2", "--users": "64", "--devices": "16", "--messages": "20000", "--window": "64", "--rounds": "3"]
    var index = 0
    while index < arguments.count {
        guard options[arguments[index]] != nil, index + 1 < arguments.count else {
            fail("unknown option or missing value: \(arguments[index]) (options: \(options.keys.sorted().joined(separator: " ")))")
        }
        options[arguments[index]] = arguments[index + 1]
        index += 2
    }
    func number(_ name: String) -> Int {
        guard let value = Int(options[name]!), value > 0 else { fail("\(name) must be a positive number, got \(options[name]!)") }
        return value
    }
    let counts = options["--threads"]!.split(separator: " ").map { Int($0) ?? 0 }
    guard !counts.isEmpty, counts.allSatisfy({ $0 > 0 }) else { fail("--threads must list positive numbers") }
    let users = number("--users"), devices = number("--devices"), messages = number("--messages")
    let window = number("--window"), rounds = number("--rounds")

    print("fan-out to \(users) users x \(devices) devices over all shards, \(messages) messages per thread, window \(window)")
    // per CPU s: events per second of the threads' own CPU time (the work per event,
    // whatever share of the machine the threads got); CPU share: that time over
    // threads × seconds (1: every thread had a core to itself all along).
    print("threads  round  events      seconds  events/s     per thread   per CPU s    CPU share  steps posted")
    var runs: [Int: [FanOutScaling.Figures]] = [:]
    for round in 1...rounds {
        for threads in round % 2 == 1 ? counts : counts.reversed() {
            let figures: FanOutScaling.Figures
            do {
                figures = try FanOutScaling.run(
                    threads: threads, users: users, devicesPerUser: devices, messagesPerThread: messages, window: window)
            } catch {
                fail("\(error)")
            }
            runs[threads, default: []].append(figures)
            print(
                String(threads).padding(toLength: 9, withPad: " ", startingAt: 0)
                    + String(round).padding(toLength: 7, withPad: " ", startingAt: 0)
                    + String(figures.events).padding(toLength: 12, withPad: " ", startingAt: 0)
                    + String(format: "%7.2f  %11.0f  %11.0f  %11.0f  %9.2f  %12d", figures.seconds, figures.eventsPerSecond,
                        figures.eventsPerSecondPerThread, figures.eventsPerCPUSecond, figures.cpuShare, figures.stepsPosted))
        }
    }
    print()
    // With a core per thread: each thread does `per CPU s` events a second.
    print("threads  median events/s  median per thread  median per CPU s  with a core per thread (threads x per CPU s)")
    func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }
    var medians: [Int: (wall: Double, cpu: Double)] = [:]
    for threads in counts {
        let figures = runs[threads] ?? []
        medians[threads] = (median(figures.map(\.eventsPerSecond)), median(figures.map(\.eventsPerCPUSecond)))
        print(
            String(threads).padding(toLength: 9, withPad: " ", startingAt: 0)
                + String(format: "%15.0f  %17.0f  %16.0f  %15.0f", medians[threads]!.wall, median(figures.map(\.eventsPerSecondPerThread)),
                    medians[threads]!.cpu, Double(threads) * medians[threads]!.cpu))
    }
    if let first = counts.first, let last = counts.last, first != last {
        let (a, b) = (medians[first]!, medians[last]!)
        print(String(format: "threads %d / threads %d: %.2fx events/s (wall); %.2fx with a core per thread (work per event: %.2fx)",
            last, first, b.wall / a.wall, Double(last) * b.cpu / (Double(first) * a.cpu), a.cpu / b.cpu))
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("routing-bench: \(message)\n".utf8))
    exit(64)
}
