#!/bin/bash
# Syscalls of the server per command during the 1 MB workload (strace -c -f), for the
# C module and a build of ours. Run in the guest like loops.sh.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
N=${REQUESTS:-200} KEYS=${KEYS:-10000}
for m in "$C" "$@"; do
  tag=$(basename "$m" .so)
  start_server "sc$tag" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || continue
  "$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set,get -d 1048576 -r "$KEYS" -n 40 -q > /dev/null 2>&1
  strace -c -f -p "$SERVER_PID" -o "$WORK/strace-$tag.txt" & sp=$!
  sleep 1
  "$B" -h "$RDMA_ADDR" -p "$PORT" -c 2 -t set,get -d 1048576 -r "$KEYS" -n "$N" -q > /dev/null 2>&1
  kill -INT $sp; wait $sp
  echo "== $tag: syscalls per command ($N commands)"
  awk -v n="$N" '$4 ~ /^[0-9]+$/ && $NF ~ /^[a-z_0-9]+$/ && $NF != "total" { printf "  %-24s %8.2f\n", $NF, $4 / n }' \
    "$WORK/strace-$tag.txt" | sort -k2 -rn | head -14
  stop_all_servers
done
