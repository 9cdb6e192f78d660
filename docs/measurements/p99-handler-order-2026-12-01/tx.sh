#!/bin/bash
. "$(dirname "$0")/common.sh"
port=8100
run() {  # BASE NEW TAG C P N [extra]
  local base=$1 new=$2 tag=$3 c=$4 p=$5 n=$6; shift 6
  echo "== $(basename $base) (as 'C module') vs $(basename $new) (as 'ours'), c$c P$p $*"
  timeout 900 "$B" --compare --server "$S" --c-module "$base" --our-module "$new" -h "$RDMA_ADDR" -p $port -q \
     --rounds 4 -c $c -P $p -d 64 -n $n --latency-trace $PWD/tr/$tag-c${c}p$p "${@:--t}" $([ $# = 0 ] && echo set,get) 2>&1 | tail -n 6 | head -5
  port=$((port + 50))
}
run /tmp/b1c9122.so /tmp/txchunks.so ab3 32 16 200000
run /tmp/b1c9122.so /tmp/txchunks.so ab3 32 1 60000
run $C /tmp/txchunks.so vsc2 32 16 200000
run $C /tmp/txchunks.so vsc2 8 16 200000
run /tmp/b1c9122.so /tmp/txchunks.so ab3big 4 1 40 -t lrange_10000,hgetall
