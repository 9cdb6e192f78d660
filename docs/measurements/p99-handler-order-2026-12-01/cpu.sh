#!/bin/bash
# Where the server's CPU goes per request: perf samples (cpu-clock, 250 Hz) of the server
# process during valkey-rdma-bench, by part, C module against ours, alternating rounds.
. "$(dirname "$0")/common.sh"
NEW=/work/main/target/release/librdma.so
PERF=/usr/bin/perf
P=${PIPELINE:-1} N=${REQUESTS:-60000} ROUNDS=${ROUNDS:-4}
port=7600
for round in $(seq 1 $ROUNDS); do
  order="$C $NEW"; [ $((round % 2)) = 0 ] && order="$NEW $C"
  for m in $order; do
    tag=$(basename "$m" .so)
    start_server "cpu$port" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || { echo "no server"; continue; }
    "$B" -h "$RDMA_ADDR" -p "$PORT" -c 32 -P "$P" -t set,get -d 64 -n 2000 -q > /dev/null 2>&1   # warm-up
    data="$WORK/perf-$tag-$round.data"
    $PERF record -e cpu-clock -F 250 -p "$SERVER_PID" -o "$data" 2> /dev/null & pp=$!
    sleep 0.5
    line=$("$B" -h "$RDMA_ADDR" -p "$PORT" -c 32 -P "$P" -t set,get -d 64 -n "$N" -q --server-pid "$SERVER_PID" 2>&1 | tail -n 1)
    kill -INT $pp; wait $pp
    echo "== round $round $tag: $line"
    $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 0 2>/dev/null | grep -v '^#' | grep -v '^$' \
      | awk -f "$(dirname "$0")/parts.awk" | sort
    echo "  top symbols of the module and rdma-core:"
    $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 0.2 2>/dev/null | grep -E "librdma|valkey-rdma.so|librxe|libibverbs" | head -8
    echo "  samples: $($PERF report -i "$data" --stdio 2>/dev/null | grep -m1 'of event' )"
    stop_all_servers; port=$((port + 50))
  done
done
