#!/bin/bash
# The 1 MB row taken apart: per request, Valkey's event-loop iterations (INFO stats
# eventloop_cycles), our writes posted (INFO rdma), server CPU, and perf's shares by part,
# for the C module and builds of ours given as arguments, alternating rounds.
# Run in the guest: ./runtest-rdma --vm -- "cd /tmp/x && .../loops.sh OURS.so [OURS2.so]"
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
PERF=/usr/bin/perf
N=${REQUESTS:-400} ROUNDS=${ROUNDS:-2} PROFILE=${PROFILE:-1} KEYS=${KEYS:-10000}
field() { "$CLI912" -h 127.0.0.1 -p "$PORT" info everything | tr -d '\r' | sed -n "s/^$1://p"; }
mods=("$C" "$@")
for round in $(seq 1 "$ROUNDS"); do
  order=("${mods[@]}"); [ $((round % 2)) = 0 ] && order=($(printf '%s\n' "${mods[@]}" | tac))
  for m in "${order[@]}"; do
    tag=$(basename "$m" .so)
    start_server "mb$round$tag" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || { echo "no server"; continue; }
    "$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set,get -d 1048576 -r "$KEYS" -n 40 -q > /dev/null 2>&1   # warm-up
    el0=$(field eventloop_cycles); cmd0=$(field total_commands_processed); w0=$(field rdma_total_rdma_writes_out)
    f0=$(awk '{print $10}' /proc/$SERVER_PID/stat); h0=$(field rdma_rx_registrations_sent)
    if [ "$PROFILE" = 1 ]; then
      data="$WORK/perf-$tag-$round.data"
      $PERF record ${PERF_ARGS:--e cpu-clock -F 250} -p "$SERVER_PID" -o "$data" 2> /dev/null & pp=$!
      sleep 0.5
    fi
    line=$("$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set,get -d 1048576 -r "$KEYS" -n "$N" -q --server-pid "$SERVER_PID" 2>&1 | tail -n 1)
    [ "$PROFILE" = 1 ] && { kill -INT $pp; wait $pp; }
    el1=$(field eventloop_cycles); cmd1=$(field total_commands_processed); w1=$(field rdma_total_rdma_writes_out)
    f1=$(awk '{print $10}' /proc/$SERVER_PID/stat); h1=$(field rdma_rx_registrations_sent)
    echo "  minor page faults per command $(( (f1 - f0) / (cmd1 - cmd0) )); RX hand-backs per command: $([ -n "$h0" ] && echo "scale=2; ($h1 - $h0) / ($cmd1 - $cmd0)" | bc); RX window now: $(field rdma_rx_window_min_bytes)-$(field rdma_rx_window_max_bytes), grown: $(field rdma_rx_windows_grown), released TX: $(field rdma_tx_buffers_released)"
    req=$((cmd1 - cmd0))
    echo "== round $round $tag: $line"
    awk -v e=$((el1 - el0)) -v r="$req" -v w0="$w0" -v w1="$w1" 'BEGIN {
      printf "  commands %d, event-loop iterations per command %.2f", r, e / r
      if (w0 != "") printf ", RDMA writes posted per command %.2f", (w1 - w0) / r
      printf "\n" }'
    if [ "$PROFILE" = 1 ]; then
      $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 0 2>/dev/null | grep -v '^#' | grep -v '^$' \
        | sed "s/ [a-z-]*librdma.so / librdma.so /" | awk -f /work/main/docs/measurements/p99-handler-order-2026-12-01/parts.awk | sort
      echo "  top symbols:"
      $PERF report -i "$data" --sort dso,sym --stdio -g none --percent-limit 1 2>/dev/null | grep -v '^#' | grep -v '^$' | head -14
    fi
    stop_all_servers
  done
done
