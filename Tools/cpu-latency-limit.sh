# Sourced by the benchmark scripts. BENCH_CPU_LATENCY_LIMIT=N (microseconds) holds a PM QoS
# request on /dev/cpu_dma_latency for the whole run, the request `voipserver
# --cpu-latency-limit N` makes: with 0, idle CPUs poll instead of halting, which on a
# virtual machine saves a trip through the hypervisor on every wake-up of a push. Applies
# to every server and tool the script runs (Mosquitto too), and ends with the script.
hold_cpu_latency_limit() {
    local limit="${BENCH_CPU_LATENCY_LIMIT:-}"
    if [[ -z "$limit" ]]; then
        echo "CPU latency limit: the host's own (set BENCH_CPU_LATENCY_LIMIT=0 to measure with idle CPUs polling)" >&2
        return 0
    fi
    [[ "$limit" =~ ^[0-9]+$ ]] && ((limit <= 1000000)) || {
        echo "BENCH_CPU_LATENCY_LIMIT must be microseconds (0 to 1000000), got '$limit'" >&2
        exit 64
    }
    exec 9>/dev/cpu_dma_latency || {
        echo "cannot open /dev/cpu_dma_latency for BENCH_CPU_LATENCY_LIMIT (needs root)" >&2
        exit 1
    }
    # Eight hex digits: any length but four is read by the kernel as a hexadecimal string.
    printf '%08x' "$limit" >&9
    echo "CPU latency limit: $limit µs, held for the whole run (BENCH_CPU_LATENCY_LIMIT)" >&2
}
