#!/bin/bash
# Server CPU per thread while nothing happens (no client; then 2 idle clients), and
# during the 1 MB workload, for the C module and builds of ours. Run in the guest.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
threads() {  # per-thread utime+stime ticks: "tid:name:ticks"
  for t in /proc/$SERVER_PID/task/*; do
    echo "$(basename $t):$(tr -d ' ' < $t/comm):$(awk '{print $14 + $15}' $t/stat)"
  done
}
delta() {  # $1 before, $2 after: ticks per thread that moved (no /dev/fd in the guest)
  echo "$1" | awk -F: '{print $1"-"$2":"$3}' | sort > "$WORK/before"
  echo "$2" | awk -F: '{print $1"-"$2":"$3}' | sort > "$WORK/after"
  join -t: -j1 "$WORK/before" "$WORK/after" \
    | awk -F: '{ d = $3 - $2; tot += d; if (d > 0) printf "    %-28s %5d ticks\n", $1, d } END { printf "    total %d ticks\n", tot }'
}
for m in "$C" "$@"; do
  tag=$(basename "$m" .so)
  start_server "idle$tag" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || continue
  "$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set -d 64 -n 100 -q > /dev/null 2>&1
  a=$(threads); sleep 10; b=$(threads)
  echo "== $tag: 10 s, no client"; delta "$a" "$b"
  a=$(threads)
  "$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set,get -d 1048576 -n 200 -q 2>&1 | tail -n 1
  b=$(threads)
  echo "== $tag: 200 commands of 1 MB SET/GET"; delta "$a" "$b"
  stop_all_servers
done
