#!/bin/bash
# bench.sh OUTDIR - our module against the upstream C module on the same server binary
# and the same client, alternating over several rounds, plus TCP; ratios ours/C.
# Under Soft-RoCE in a TCG guest the absolute numbers measure the emulator; the ratios
# between the two modules (same server, same client, same run) are what to read.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
OUT=${1:-$PWD}
B=$PROJECT_ROOT/target/release/valkey-rdma-bench
run() {  # NAME ARGS...
    local name=$1; shift
    echo "== $name: $*"
    "$B" --compare --server "$VALKEY_912/src/valkey-server" --c-module "$VALKEY_912/src/valkey-rdma.so" \
        --our-module "$OUR_MODULE" -h "$RDMA_ADDR" -p "$NEXT_PORT" -q "$@" \
        --json "$OUT/$name.json" --svg "$OUT/$name.svg" | tee "$OUT/$name.txt"
    NEXT_PORT=$((NEXT_PORT + 50))
}
run set-get-c8-p1 --rounds 3 -c 8 -P 1 -t set,get -d 64 -n 20000
run set-get-c8-p16 --rounds 3 -c 8 -P 16 -t set,get -d 64 -n 100000
run set-get-c4-4k --rounds 3 -c 4 -P 1 -t set,get -d 4096 -n 10000
# replies of many blocks (about 1.1 MB and 1.2 MB each: the multi-block reply path)
run big-replies-c4 --rounds 3 -c 4 -P 1 -t lrange_10000,hgetall -d 100 -n 200
echo "results in $OUT"
