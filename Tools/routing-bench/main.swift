// How long a message to a user with many devices holds the recipient's routing shard:
// the fan-out in one hold (as before chunks) against chunks of `fanOutChunk` devices, for
// 1,000 and 10,000 devices, without a store and with one (every hold building its commit
// unit; release build; docs/LOAD-TESTING.md, "Fan-out holds").
//
//   swift build -c release --product routing-bench && .build/release/routing-bench [MESSAGES]
import Foundation
import SignalingServer

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
