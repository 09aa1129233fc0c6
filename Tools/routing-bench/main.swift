// How long a message to a user with many devices holds the recipient's routing shard:
// the fan-out in one hold (as before chunks) against chunks of `fanOutChunk` devices, for
// 1,000 and 10,000 devices, without a store and with one (every hold building its commit
// unit; release build; docs/LOAD-TESTING.md, "Fan-out holds"). Then how long one ACK of
// 4,000 messages from a sender on another shard holds the shards: in one hold (as before
// chunks) against chunks of `ackChunk` events (docs/LOAD-TESTING.md, "ACK holds").
//
//   swift build -c release --product routing-bench && .build/release/routing-bench [MESSAGES]
//
// MESSAGES: fan-out messages per case (default 50); the ACK cases run MESSAGES / 5 ACKs
// (at least 3), and so do the cases of the last table (holds chunked since the fan-out, in
// one hold against in chunks: a message's synced copies to 1,000 devices of its sender and
// their settle step, a receipt to them, a first device's claim of 10,000 held messages, a
// ring of 1,000 devices, an accept's answeredElsewhere and a ring timeout's noAnswer to them).
//
//   .build/release/routing-bench scaling [--threads "1 2"] [--users 64] [--devices 16]
//       [--messages 20000] [--window 64] [--rounds 3] [--busy-poll 0] [--ceiling yes]
//
// `scaling`: whether routing scales with cores (issue 16; docs/LOAD-TESTING.md, "Routing
// on more cores"): K threads, each owning one shard of K as a server's loops do, fan out
// to `--users` users of `--devices` devices spread over all shards (`FanOutScaling`); each
// thread sends `--messages` messages. Every count of `--threads`, alternated in each of
// `--rounds` rounds (1 2, then 2 1, ...); prints every run, the medians and the ratio of the
// last count to the first. Under each run, per thread and per 1,000 events: its turns,
// those that found nothing, its waits on the inbox's eventfd, the eventfd writes that woke
// it, and the share of the wall it spent waiting. `--busy-poll` µs: as the server's option,
// an idle thread keeps turning that long after its last busy turn before it waits.
// `--ceiling yes` (the default) also runs, in the same rounds, each count above one (when
// `--threads` lists more than one) as that many independent one-shard servers, a thread each, sharing nothing ("2 indep"): what the
// host gives that many threads, against which the sharded run's scaling is the shards' own
// (docs/LOAD-TESTING.md, "The host's ceiling"); `no` leaves it out. The last line gives the
// ratios within each round too (last count to first; sharded to independent).
//
//   .build/release/routing-bench growth [KEYS]
//
// `growth`: the slowest insert while a routing table grows from empty to KEYS (default
// 1,000,000) message-id-like keys: a Swift `Dictionary` (rehashes every key when it
// outgrows its storage) against the incremental table the routing core uses, and the
// core's own paths (one sender's message ids, new users' activity records), the dedup
// window's queue and an expiry heap; three rounds (docs/LOAD-TESTING.md, "Tables that grow
// a few slots at a time").
import Foundation
import SignalingServer

if CommandLine.arguments.dropFirst().first == "scaling" {
    runScaling(Array(CommandLine.arguments.dropFirst(2)))
    exit(0)
}
if CommandLine.arguments.dropFirst().first == "growth" {
    let keys = CommandLine.arguments.dropFirst(2).first.flatMap { Int($0) } ?? 1_000_000
    guard keys > 0 else { fail("growth: KEYS must be a positive number") }
    print("table                                    round  inserts    longest µs  over 100 µs  mean ns")
    for round in 1...3 {
        for figure in TableGrowthBenchmark.run(count: keys) {
            print(
                figure.table.padding(toLength: 41, withPad: " ", startingAt: 0)
                    + String(round).padding(toLength: 7, withPad: " ", startingAt: 0)
                    + String(figure.inserts).padding(toLength: 9, withPad: " ", startingAt: 0)
                    + String(format: "%12.1f  %11d  %7.0f", Double(figure.longest) / 1000, figure.over100Microseconds, figure.mean))
        }
    }
    exit(0)
}

let messages = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 50
print("store   devices  chunk       holds/msg  longest hold µs  mean longest µs  ns per device (all holds)")
for journaling in [false, true] {
    for devices in [1_000, 10_000] {
        for chunk in [Int.max, FanOutBenchmark.defaultChunk] {
            let figures = FanOutBenchmark.run(devices: devices, chunk: chunk, messages: messages, journaling: journaling)
            let chunkText = chunk == Int.max ? "one hold" : String(chunk)
            print(
                (journaling ? "yes" : "no").padding(toLength: 8, withPad: " ", startingAt: 0)
                    + String(devices).padding(toLength: 9, withPad: " ", startingAt: 0)
                    + chunkText.padding(toLength: 12, withPad: " ", startingAt: 0)
                    + String(format: "%9.1f  %15.1f  %15.1f  %25.1f", figures.holdsPerMessage, Double(figures.longestHold) / 1000,
                        figures.meanLongestHold / 1000, figures.nanosecondsPerDevice))
        }
    }
}

let acks = max(3, messages / 5)
print()
print("store   events   chunk       holds/ACK  longest hold µs  mean longest µs  ns per event (all holds)")
for journaling in [false, true] {
    for chunk in [Int.max, AckBenchmark.defaultChunk] {
        let figures = AckBenchmark.run(events: 4_000, chunk: chunk, rounds: acks, journaling: journaling)
        let chunkText = chunk == Int.max ? "one hold" : String(chunk)
        print(
            (journaling ? "yes" : "no").padding(toLength: 8, withPad: " ", startingAt: 0)
                + String(figures.events).padding(toLength: 9, withPad: " ", startingAt: 0)
                + chunkText.padding(toLength: 12, withPad: " ", startingAt: 0)
                + String(format: "%9.1f  %15.1f  %15.1f  %25.1f", figures.holdsPerAck, Double(figures.longestHold) / 1000,
                    figures.meanLongestHold / 1000, figures.nanosecondsPerEvent))
    }
}

// The holds that grew with an input (docs/ARCHITECTURE.md, "Bounded holds"), in one hold
// (as before chunks) and in chunks: a message's synced copies to 1,000 devices of its
// sender, their settle step and a receipt to them; 10,000 messages held for a user with no
// device claimed by its first device; and a call to a user with 1,000 devices: its ring,
// an accept's and a ring timeout's endings.
print()
print("operation                                                 size     longest hold µs  mean longest µs  holds/op  mean hold µs")
for figure in HoldSurvey.run(devices: 1_000, held: 10_000, rounds: max(3, messages / 5)) {
    print(
        figure.operation.padding(toLength: 58, withPad: " ", startingAt: 0)
            + String(figure.size).padding(toLength: 9, withPad: " ", startingAt: 0)
            + String(format: "%15.1f  %15.1f  %8.1f  %12.1f", Double(figure.longestHold) / 1000, figure.meanLongestHold / 1000,
                figure.holdsPerOperation, figure.meanHold / 1000))
}
