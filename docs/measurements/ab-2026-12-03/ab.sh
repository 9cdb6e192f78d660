#!/bin/bash
# old (26fdd20) against new (this stop's head), module against module, same server binary
. /tmp/snapb/testbed/env.sh
B=/tmp/snapb/target/release/valkey-rdma-bench
OLD=/tmp/snap26/librdma-26fdd20.so NEW=/tmp/snapb/target/release/librdma.so
port=6900
run() {
    local name=$1 c=$2 n=$3; shift 3
    echo "== $name (C column: $c; ours column: $n): $*"
    "$B" --compare --server "$VALKEY_912/src/valkey-server" --c-module "$c" --our-module "$n" -h "$RDMA_ADDR" -p $port -q --warmup 1 "$@" \
        --json "$PWD/$name.json" > "$PWD/$name.txt" 2>&1
    port=$((port + 50))
    grep -E "requests/s|p50 latency|p99 latency|server CPU s" "$PWD/$name.txt" | tail -4
}
run c8-p16-old-vs-new "$OLD" "$NEW" --rounds 5 -c 8 -P 16 -t set,get -d 64 -n 100000
run c2-1m-old-vs-new "$OLD" "$NEW" --rounds 5 -c 2 -P 1 -t set,get -d 1048576 -r 2 -n 200
run c8-p16-new-vs-new "$NEW" "$NEW" --rounds 5 -c 8 -P 16 -t set,get -d 64 -n 100000
