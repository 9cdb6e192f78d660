#!/bin/bash
. /work/main/tests/e2e/lib.sh
OURS=/work/main/target/release/librdma.so C=$VALKEY_912/src/valkey-rdma.so
for r in 1 2 3 4; do
  for v in c ours; do
    case $v in c) A=(--loadmodule $C);; ours) A=(--loadmodule $OURS);; esac
    start_server p99-$v-$r "$VALKEY_912/src/valkey-server" "${A[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ >/dev/null || exit 1
    out=$(timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 32 -P 16 -d 64 -n 200000 -t set,get --csv 2>&1 | tr -d '"' | grep -E "^(SET|GET)," | cut -d, -f1,2,5,6,7 | tr '\n' ' ')
    g=$("$CLI912" -p $PORT INFO rdma 2>/dev/null | tr -d '\r' | grep -E "grown" | tr '\n' ' ')
    echo "r$r $v: $out $g"
    stop_all_servers
  done
done
E2E_ONLY='adaptive RX|pinned memory|multi-block|pipelin|io-threads|big' /work/main/tests/e2e/suite.sh --impl ours 2>&1 | grep -E "^(ok|not ok|FAIL|#.*grown|e2e:)"
