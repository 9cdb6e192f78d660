#!/bin/bash
# A/B: cur.so (as "C module") against x16.so (as "ours")
V=/root/.cache/valkey-rdma-testbed/valkey-9.1.2/src/valkey-server
B=/work/main/target/release/valkey-rdma-bench
P=7100
for row in "c32-p16 -c 32 -P 16 -n 200000" "c8-p16 -c 8 -P 16 -n 100000"; do
  set -- $row; name=$1; shift
  echo "== $name"
  "$B" --compare --server "$V" --c-module /tmp/ab/cur.so --our-module /tmp/ab/x16.so -h "$RDMA_ADDR" -p $P -q --warmup 1 --rounds ${ROUNDS:-4} -t set,get -d 64 "$@" --latency-trace "$PWD/$name" --json "$PWD/$name.json" | tee "$PWD/$name.txt"
  P=$((P+50))
done
