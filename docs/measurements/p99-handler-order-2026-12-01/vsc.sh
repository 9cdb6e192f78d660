#!/bin/bash
. "$(dirname "$0")/common.sh"
NEW=${NEW:-/tmp/reversed.so}
port=7900
for spec in ${SPECS:-"8 1 60000" "8 16 200000" "32 1 60000" "32 16 200000"}; do
  set -- $spec
  echo "== C module vs $(basename $NEW), c$1 P$2"
  timeout 900 "$B" --compare --server "$S" --c-module "$C" --our-module "$NEW" -h "$RDMA_ADDR" -p $port -q \
     --rounds ${ROUNDS:-4} -c $1 -P $2 -t set,get -d 64 -n $3 --latency-trace $PWD/tr/vsc-c$1p$2 2>&1 | tail -n 6 | head -5
  port=$((port + 50))
done
