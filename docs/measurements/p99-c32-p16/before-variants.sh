#!/bin/bash
. /work/main/tests/e2e/lib.sh
# CAP: a build of the same tree whose RX buffer grows straight to rdma-rx-size (conn.rs: Some(self.rx_cap))
OURS=/work/main/target/release/librdma.so CAP=/tmp/mut-cap-target/release/librdma.so C=$VALKEY_912/src/valkey-rdma.so
for r in 1 2 3 4; do
  for v in c ours cap ours64k; do
    case $v in c) A=(--loadmodule $C);; ours) A=(--loadmodule $OURS);; cap) A=(--loadmodule $CAP);; ours64k) A=(--loadmodule $OURS --rdma-rx-size 65536);; esac
    start_server p99-$v-$r "$VALKEY_912/src/valkey-server" "${A[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ >/dev/null || exit 1
    out=$(timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 32 -P 16 -d 64 -n 200000 -t set,get --csv 2>&1 | tr -d '"' | grep -E "^(SET|GET)," | cut -d, -f1,2,5,6,7 | tr '\n' ' ')
    echo "r$r $v: $out"
    stop_all_servers
  done
done
