import Foundation
import SignalingServer

/// `routing-bench scaling` (see main.swift).
func runScaling(_ arguments: [String]) {
    var options = ["--threads": "1 2", "--users": "64", "--devices": "16", "--messages": "20000", "--window": "64", "--rounds": "3", "--busy-poll": "0", "--ceiling": "yes"]
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
    guard let busyPoll = Int(options["--busy-poll"]!), busyPoll >= 0 else { fail("--busy-poll must be microseconds, >= 0") }
    guard ["yes", "no"].contains(options["--ceiling"]!) else { fail("--ceiling must be yes or no") }
    // The host's ceiling: each count above one also run as that many independent
    // one-shard servers, one per thread, alternated with the others (`FanOutScaling.run`).
    // Only beside another count, which it is compared with: a single count (`--threads 2`,
    // as `Tools/bench-fanout-callgrind` and `Tools/bench-shared-counts` run it) runs alone.
    let ceilings = options["--ceiling"] == "yes" && counts.count > 1 ? counts.filter { $0 > 1 } : []
    let kinds = counts.map { (threads: $0, independent: false) } + ceilings.map { (threads: $0, independent: true) }
    func label(_ kind: (threads: Int, independent: Bool)) -> String { kind.independent ? "\(kind.threads) indep" : "\(kind.threads)" }

    print("fan-out to \(users) users x \(devices) devices over all shards, \(messages) messages per thread, window \(window)"
        + (busyPoll > 0 ? ", busy-poll \(busyPoll) us" : ""))
    // per CPU s: events per second of the threads' own CPU time (the work per event,
    // whatever share of the machine the threads got); CPU share: that time over
    // threads × seconds (1: every thread had a core to itself all along).
    print("threads  round  events      seconds  events/s     per thread   per CPU s    CPU share  steps posted")
    var runs: [String: [FanOutScaling.Figures]] = [:]
    for round in 1...rounds {
        for kind in round % 2 == 1 ? kinds : kinds.reversed() {
            let figures: FanOutScaling.Figures
            do {
                figures = try FanOutScaling.run(
                    threads: kind.threads, users: users, devicesPerUser: devices, messagesPerThread: messages, window: window,
                    busyPoll: .microseconds(busyPoll), independent: kind.independent)
            } catch {
                fail("\(error)")
            }
            runs[label(kind), default: []].append(figures)
            print(
                label(kind).padding(toLength: 9, withPad: " ", startingAt: 0)
                    + String(round).padding(toLength: 7, withPad: " ", startingAt: 0)
                    + String(figures.events).padding(toLength: 12, withPad: " ", startingAt: 0)
                    + String(format: "%7.2f  %11.0f  %11.0f  %11.0f  %9.2f  %12d", figures.seconds, figures.eventsPerSecond,
                        figures.eventsPerSecondPerThread, figures.eventsPerCPUSecond, figures.cpuShare, figures.stepsPosted))
            // Per thread, per 1,000 events of all threads: turns, turns that found nothing,
            // waits on the eventfd, eventfd writes that woke it, and the share of the wall
            // time it spent waiting (time not running that is not the scheduler's).
            let thousands = Double(figures.events) / 1000
            for (thread, counts) in figures.turns.enumerated() {
                print(String(format: "         thread %d: turns %.1f  idle %.1f  waits %.1f  timeouts %d  woken %.1f per 1,000 events; blocked %.1f %% of the wall",
                    thread, Double(counts.turns) / thousands, Double(counts.idle) / thousands, Double(counts.waits) / thousands,
                    counts.timeouts, Double(counts.wakeUpsWritten) / thousands, 100 * counts.blockedSeconds / figures.seconds))
            }
        }
    }
    print()
    // With a core per thread: each thread does `per CPU s` events a second.
    print("threads  median events/s  median per thread  median per CPU s  with a core per thread (threads x per CPU s)")
    func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }
    var medians: [String: (wall: Double, cpu: Double)] = [:]
    for kind in kinds {
        let figures = runs[label(kind)] ?? []
        let wall = median(figures.map(\.eventsPerSecond)), cpu = median(figures.map(\.eventsPerCPUSecond))
        medians[label(kind)] = (wall, cpu)
        print(
            label(kind).padding(toLength: 9, withPad: " ", startingAt: 0)
                + String(format: "%15.0f  %17.0f  %16.0f  %15.0f", wall, median(figures.map(\.eventsPerSecondPerThread)),
                    cpu, Double(kind.threads) * cpu))
    }
    if let first = counts.first, let last = counts.last, first != last {
        let (a, b) = (medians[label((first, false))]!, medians[label((last, false))]!)
        print(String(format: "threads %d / threads %d: %.2fx events/s (wall); %.2fx with a core per thread (work per event: %.2fx)",
            last, first, b.wall / a.wall, Double(last) * b.cpu / (Double(first) * a.cpu), a.cpu / b.cpu))
        // What the host gave threads that share nothing, in the same rounds: the sharded
        // run's scaling against it is the shards' own.
        if let c = medians[label((last, true))] {
            print(String(format: "host ceiling, %d independent one-shard servers / threads %d: %.2fx events/s (wall) (work per event: %.2fx); the sharded run reaches %.0f %% of it",
                last, first, c.wall / a.wall, a.cpu / c.cpu, 100 * b.wall / c.wall))
        }
        // The same ratios within each round, whose runs follow one another: each compares
        // minutes close together, where the medians above may pair a fast minute with a
        // slow one.
        func perRound(_ top: String, _ bottom: String) -> [Double] {
            zip(runs[top] ?? [], runs[bottom] ?? []).map { $0.eventsPerSecond / $1.eventsPerSecond }
        }
        let scaling = perRound(label((last, false)), label((first, false)))
        var line = "within each round: threads \(last) / threads \(first) "
            + scaling.map { String(format: "%.2f", $0) }.joined(separator: " ")
            + String(format: " (median %.2fx)", median(scaling))
        if runs[label((last, true))] != nil {
            let share = perRound(label((last, false)), label((last, true)))
            line += "; sharded / ceiling " + share.map { String(format: "%.0f %%", 100 * $0) }.joined(separator: " ")
                + String(format: " (median %.0f %%)", 100 * median(share))
        }
        print(line)
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("routing-bench: \(message)\n".utf8))
    exit(64)
}
