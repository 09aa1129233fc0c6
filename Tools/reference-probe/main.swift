// reference-probe: push latency of an MQTT broker or of voipserver, measured with one and
// the same client-side method, to calibrate what the machine and the method cost.
//
//   swift build -c release --product reference-probe
//   .build/release/reference-probe --protocol mqtt --server 127.0.0.1:1883 --subscribers 15000 \
//       --events 20000 --rate 2000 --payload-bytes 64 --server-pid $(pidof mosquitto)
//
// Tools/bench-reference runs it against Mosquitto and voipserver (memory and SQLite stores).
#if canImport(Glibc)
import Glibc
#endif

exit(ProbeCommand.main(Array(CommandLine.arguments.dropFirst())))
