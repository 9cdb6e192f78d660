#!/bin/bash
. "$(dirname "$0")/common.sh"
port=8400
run() {  # BASE NEW TAG C P N [-t cmds]
  local base=$1 new=$2 tag=$3 c=$4 p=$5 n=$6; shift 6
  local t=(-t set,get); [ $# -gt 0 ] && t=("$@")
  echo "== $(basename $base) (as 'C module') vs $(basename $new) (as 'ours'), c$c P$p ${t[*]}"
  timeout 900 "$B" --compare --server "$S" --c-module "$base" --our-module "$new" -h "$RDMA_ADDR" -p $port -q \
     --rounds 4 -c $c -P $p -d 64 -n $n --latency-trace $PWD/tr/$tag-c${c}p$p "${t[@]}" 2>&1 | tail -n 6 | head -5
  port=$((port + 50))
}
run /tmp/b1c9122.so /tmp/tx2.so ab4big 4 1 80 -t lrange_10000,hgetall
run $C /tmp/tx2.so vsc3 32 16 200000
run $C /tmp/tx2.so vsc3 8 16 200000
run /tmp/b1c9122.so /tmp/tx2.so ab4 8 16 200000
run $C /tmp/tx2.so vsc3 32 1 60000
