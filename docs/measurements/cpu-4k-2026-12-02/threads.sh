#!/bin/bash
# threads.sh ROUNDS N: the 4 KiB row of --bench (valkey-benchmark --rdma -c 4 -P 1 -t set,get
# -d 4096 -n N), C module and ours alternating, a fresh server each run; after each run the
# server's CPU time by thread (utime + stime, clock ticks) and its registrations, to see where
# ours' extra CPU per request goes. Runs in the guest:
#   testbed/run-in-vm.sh -t 1800 -- 'bash docs/measurements/cpu-4k-2026-12-02/threads.sh 3 10000'
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
rounds=${1:-3} n=${2:-10000}
for r in $(seq 1 "$rounds"); do
    order="c ours"; [ $((r % 2)) = 0 ] && order="ours c"
    for m in $order; do
        mod=$OUR_MODULE; [ "$m" = c ] && mod=$VALKEY_912/src/valkey-rdma.so
        start_server "t-$m-$r" "$VALKEY_912/src/valkey-server" --loadmodule "$mod" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || exit 1
        declare -A t0=()
        for t in /proc/$SERVER_PID/task/*; do t0[$t]=$(awk '{print $14 + $15}' "$t/stat"); done
        "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 4 -P 1 -t set,get -d 4096 -n "$n" -q 2>&1 | tr '\r' '\n' | grep 'requests per second' | tr '\n' ' '
        echo
        line="round $r $m:"
        total=0
        for t in /proc/$SERVER_PID/task/*; do
            c=$(cat "$t/comm") v=$(awk '{print $14 + $15}' "$t/stat")
            d=$((v - ${t0[$t]:-0})); total=$((total + d))
            [ "$d" -gt 0 ] && line+=" $c=$d"
        done
        echo "$line total=$total ticks"
        [ "$m" = ours ] && "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep -E "rx_windows_grown|rx_registrations_sent|pinned" | tr '\n' ' ' && echo
        stop_all_servers
    done
done
