#!/bin/bash
# own CQ (before) against shared CQ (now), p99 with latency traces
. "$(dirname "$0")/common.sh"
OLD=/tmp/main-before-scq.so
NEW=/work/main/target/release/librdma.so
port=7700
for P in 16 1; do
  echo "== own CQ (as 'C module') vs shared CQ (as 'ours'), c8 P$P"
  timeout 900 "$B" --compare --server "$S" --c-module "$OLD" --our-module "$NEW" -h "$RDMA_ADDR" -p $port -q \
     --rounds 4 -c 8 -P $P -t set,get -d 64 -n $((P == 16 ? 200000 : 60000)) --latency-trace $PWD/tr/ab-c8p$P 2>&1 | tail -n 7
  port=$((port + 50))
done
