#!/bin/bash
. "$(dirname "$0")/common.sh"
OLD=${OLD:-/tmp/head.so}
NEW=${NEW:-/tmp/reversed.so}
port=7800
for spec in "8 1 60000" "8 16 200000" "32 16 200000"; do
  set -- $spec
  echo "== $(basename $OLD) (as 'C module') vs $(basename $NEW) (as 'ours'), c$1 P$2"
  timeout 900 "$B" --compare --server "$S" --c-module "$OLD" --our-module "$NEW" -h "$RDMA_ADDR" -p $port -q \
     --rounds 4 -c $1 -P $2 -t set,get -d 64 -n $3 --latency-trace $PWD/tr/ab2-c$1p$2 2>&1 | tail -n 6 | head -5
  port=$((port + 50))
done
