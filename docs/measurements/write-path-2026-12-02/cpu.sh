#!/bin/bash
# cpu.sh ROUNDS BUILD...: where the server's CPU goes per request, by part (perf
# cpu-clock samples of the server process), for the C module and builds of ours
# (/tmp/ab/librdma-BUILD.so), the order rotating each round. The workload is
# valkey-rdma-bench (the --bench client) with CONNS (32), PIPELINE (1), SIZE (64 B) and
# REQUESTS (60000). Runs in the guest (from its writable run folder), e.g.:
#   testbed/run-in-vm.sh -t 1200 -- "CONNS=4 SIZE=4096 REQUESTS=10000 bash /work/main/docs/measurements/write-path-2026-12-02/cpu.sh 3 26fdd20 wr de6ec3d"
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
HERE=/work/main/docs/measurements
AWK=$HERE/p99-handler-order-2026-12-01/parts.awk
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
PERF=/usr/bin/perf
ROUNDS=${1:-3}; shift
P=${PIPELINE:-1} N=${REQUESTS:-60000} CONNS=${CONNS:-32} SIZE=${SIZE:-64}
. "$HERE/rotate.sh"
modules "$@"
for round in $(seq 1 "$ROUNDS"); do
  for m in $(rotation "$round"); do
    tag=$(basename "$m" .so)
    start_server "cpu-$tag-$round" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || { echo "no server"; continue; }
    "$B" -h "$RDMA_ADDR" -p "$PORT" -c "$CONNS" -P "$P" -t set,get -d "$SIZE" -n 2000 -q > /dev/null 2>&1   # warm-up
    data="$PWD/perf-$tag-$round.data"
    $PERF record -e cpu-clock -F 250 -p "$SERVER_PID" -o "$data" 2> /dev/null & pp=$!
    sleep 0.5
    line=$("$B" -h "$RDMA_ADDR" -p "$PORT" -c "$CONNS" -P "$P" -t set,get -d "$SIZE" -n "$N" -q --server-pid "$SERVER_PID" 2>&1 | tail -n 1)
    kill -INT $pp; wait $pp
    echo "== round $round $tag: $line"
    $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 0 2>/dev/null | grep -v '^#' | grep -v '^$' \
      | awk -f "$AWK" | sort
    echo "  top symbols of the module:"
    $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 0.2 2>/dev/null | grep -E "librdma|valkey-rdma.so" | head -8
    echo "  top symbols of the server:"
    $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 1 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
    echo "  samples: $($PERF report -i "$data" --stdio 2>/dev/null | grep -m1 'of event' )"
    case "$tag" in librdma*)
      echo "  INFO rdma: $("$VALKEY_912/src/valkey-cli" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' \
        | grep -E 'rx_registrations|windows_grown|wakeups|completions:|per_wakeup|budget|tx_buffers_released|writes_' | tr '\n' ' ')";;
    esac
    rm -f "$data"
    stop_all_servers
  done
done
