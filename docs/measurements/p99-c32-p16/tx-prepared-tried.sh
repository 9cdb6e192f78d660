#!/bin/bash
. /work/main/tests/e2e/lib.sh
NEW=/work/main/target/release/librdma.so OLD=/tmp/mut-cap-target/release/librdma.so C=$VALKEY_912/src/valkey-rdma.so
for r in 1 2 3; do
  for v in c old new; do
    case $v in c) M=$C;; old) M=$OLD;; new) M=$NEW;; esac
    start_server tx-$v-$r "$VALKEY_912/src/valkey-server" --loadmodule $M --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ >/dev/null || exit 1
    out=$(timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 32 -P 16 -d 64 -n 200000 -t set,get --csv 2>&1 | tr -d '"' | grep -E "^(SET|GET)," | cut -d, -f1,2,5,6,7 | tr '\n' ' ')
    churn=$(timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -k 0 -c 4 -n 800 -t ping_inline --csv 2>&1 | tr -d '"' | grep -E "^PING" | cut -d, -f1,2,5,7 | tr '\n' ' ')
    echo "r$r $v: $out | churn $churn"
    stop_all_servers
  done
done
